"""Whether this CPU multiplies bf16 natively: GFLOP/s of one linear layer's product in
fp32, in bf16 and under bf16 autocast, side by side (SmolLM2-135M's MLP shape: 512
tokens x 576 -> 1536), and what ``learner.bf16: auto`` picks here.

    python benchmarks/bench_bf16_matmul.py [--threads 2] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import time


def gflops(call, flops: float, seconds: float) -> float:
    call()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        call()
        n += 1
    return round(flops * n / (time.perf_counter() - start) / 1e9, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    import torch

    from gaca_agent.learner.precision import cpu_has_bf16

    torch.set_num_threads(args.threads)
    m, k, n = 512, 576, 1536
    flops = 2.0 * m * k * n
    x, w = torch.randn(m, k), torch.randn(n, k)
    xb, wb = x.bfloat16(), w.bfloat16()
    linear = torch.nn.functional.linear

    def autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear(x, w)

    report = {"threads": args.threads, "native_bf16": cpu_has_bf16(),
              "fp32_gflops": gflops(lambda: linear(x, w), flops, args.seconds),
              "bf16_gflops": gflops(lambda: linear(xb, wb), flops, args.seconds),
              "autocast_gflops": gflops(autocast, flops, args.seconds)}
    report["bf16_vs_fp32"] = round(report["bf16_gflops"] / report["fp32_gflops"], 2)
    report["learner.bf16: auto"] = "bf16" if report["native_bf16"] else "fp32"
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
