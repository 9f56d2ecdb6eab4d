"""Learner throughput on CPU: tokens/s of a PPO update for the tiny model and SmolLM2+LoRA.

Synthetic step samples (prompt ~N tokens, completion ~M tokens, random advantages); one
warm-up update, then the median of ``--repeats`` timed updates. Tokens counted are
completion (trained) tokens; the forward pass also covers the prompts.

    python benchmarks/bench_learner.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch


def samples(n, prompt_len, comp_len, vocab, seed=0):
    """(a StepTable of n random rows, their advantages)."""
    from gaca_agent.steps import StepTable

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab, (prompt_len,), generator=g).tolist() for _ in range(n)]
    comps = [torch.randint(10, vocab, (comp_len,), generator=g).tolist() for _ in range(n)]
    adv = torch.randn(n, generator=g).numpy()
    return StepTable.from_tokens(prompts, comps, [[-1.0] * comp_len] * n), adv


def bench(name, path, cfg_kwargs, n, prompt_len, comp_len, repeats):
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.learner.core import Learner, LearnerConfig

    tok = AutoTokenizer.from_pretrained(path)
    learner = Learner(path, tok, LearnerConfig(**cfg_kwargs), Accelerator(cpu=True))
    table, adv = samples(n, prompt_len, comp_len, len(tok))
    learner.update(table, adv)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        m = learner.update(table, adv)
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    return {"model": name, "samples": n, "prompt_tokens": prompt_len,
            "completion_tokens": comp_len, "update_s": round(t, 3),
            "trained_tokens_per_s": round(m["train/tokens"] / t, 1),
            "all_tokens_per_s": round(n * (prompt_len + comp_len) / t, 1),
            "trainable_params": sum(p.numel() for p in learner.unwrapped.parameters()
                                    if p.requires_grad)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from gaca_agent.policies.tiny_model import build_tiny_model

    tiny = str(build_tiny_model(tempfile.mkdtemp() + "/tiny"))
    rows = [bench("tiny (full)", tiny, {"lr": 1e-3, "kl_coef": 0.01, "micro_batch_size": 32},
                  256, 120, 16, args.repeats)]
    try:
        from gaca_agent.policies.smollm2 import smollm2_path

        rows.append(bench("SmolLM2-135M + LoRA r=8", str(smollm2_path()),
                          {"lr": 1e-4, "kl_coef": 0.01, "lora_r": 8, "micro_batch_size": 4},
                          16, 256, 48, args.repeats))
    except ImportError as err:
        print(f"skipping SmolLM2: {err}", file=sys.stderr)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
