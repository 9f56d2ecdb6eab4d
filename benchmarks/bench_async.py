"""Asynchronous training against lock-step, side by side in one invocation.

    python benchmarks/bench_async.py                         # Diag and ALFWorld, K = 0, 1, 2
    python benchmarks/bench_async.py --suites diag --iterations 6 --seeds 0
    python benchmarks/bench_async.py --sync-only             # disk vs broadcast only
    python benchmarks/bench_async.py --suites diag --staleness 0 1 --seeds 0 1 2 \
        --iterations 10 env.groups=8 env.group_size=8 warmup.bc_steps=150 env.eval_episodes=64

1. **Training** (per suite, per seed, per K in ``--staleness``): the same run (tiny model,
   full fine-tuning, weights broadcast over gloo) with rollouts on a ``gaca-serve``
   process pinned to core 0 and the learner (with its envs) pinned to core 1. Reports the
   mean wall seconds per iteration after the first, the learner's and the server's busy
   shares, and held-out success after the same number of updates; ratios are against
   K = 0 with the same seed.
2. **Weight sync**: one model's full weights into one ``gaca-serve``: written to disk
   and loaded (``server.weight_transfer: disk``) vs broadcast over gloo
   (``broadcast``), interleaved ``--repeats`` times; seconds per GB and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve_process import start_gaca_serve  # noqa: E402

SUITES = {
    "diag": ["env.id=gaca/Diag-Signs-v0", "env.kwargs={split: train}",
             "env.eval_kwargs={split: test}", "env.history_length=0"],
    "alfworld": ["env.id=gaca/ALFWorld-v0", "env.kwargs={split: valid_seen}",
                 "env.eval_kwargs={split: valid_unseen}", "env.history_length=1",
                 "env.groups=2", "env.max_live_envs=8", "env.eval_episodes=16"],
}
COMMON = ["eval_every=0", "checkpoint_every=0", "keep_rollouts=false", "env.groups=4",
          "env.group_size=4", "env.max_live_envs=16", "env.workers=0",
          "env.eval_episodes=32", "env.invalid_penalty=-0.1", "learner.lr=0.001",
          "learner.old_logprobs=recompute", "learner.tis_cap=2", "learner.kl_coef=0.0",
          "learner.micro_batch_size=16", "warmup.bc_steps=60", "warmup.bc_episodes=16",
          "model.max_new_tokens=16", "model.engine=server", "server.model=tiny",
          "server.kind=sglang", "server.weight_transfer=broadcast"]


def train(out: Path, name: str, args: list[str], core: int | None) -> list[dict]:
    cmd = [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config",
           str(ROOT / "gaca_agent/configs/default.yaml"), f"out_dir={out}", f"name={name}", *args]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    if run.returncode:
        raise RuntimeError(f"{name} failed: {run.stderr[-2000:]}")
    return [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]


def final_success(out: Path, name: str) -> float:
    return json.loads((out / name / "final_eval" / "results.json").read_text())["success_rate"]


def training(suites, staleness, seeds, iterations, out: Path, cores,
             extra: list[str] = ()) -> list[dict]:
    from gaca_agent.policies.tiny_model import cached_tiny_model

    rows = []
    for suite in suites:
        for seed in seeds:
            for k in staleness:
                model = str(cached_tiny_model(seed))
                proc, base = start_gaca_serve(model, "tiny", core=cores[0],
                                              env={"OMP_NUM_THREADS": "1"})
                name = f"{suite}-s{seed}-k{k}"
                try:
                    t0 = time.perf_counter()
                    metrics = train(out, name, [*COMMON, *SUITES[suite], *extra,
                                                f"seed={seed}", f"iterations={iterations}",
                                                f"max_staleness={k}",
                                                f"server.base_url={base}"], cores[1])
                    wall = time.perf_counter() - t0
                finally:
                    proc.kill()
                its = [m for m in metrics if m["iteration"] >= 1]
                row = {"suite": suite, "seed": seed, "K": k, "iterations": iterations,
                       "s_per_iteration": statistics.mean(m["perf/iteration_s"] for m in its),
                       "learner_busy": statistics.mean(m["perf/learner_busy"] for m in its),
                       "server_busy": statistics.mean(m["perf/server_busy"] for m in its),
                       "stale_mean": statistics.mean(m.get("async/stale_mean", 0.0)
                                                     for m in its),
                       "heldout_success": final_success(out, name), "wall_s": wall}
                rows.append(row)
                print(json.dumps({"training": row}), flush=True)
    for row in rows:  # ratios against K = 0, same suite and seed
        lockstep = next(r for r in rows if (r["suite"], r["seed"], r["K"]) ==
                        (row["suite"], row["seed"], 0))
        row["speedup_vs_k0"] = lockstep["s_per_iteration"] / row["s_per_iteration"]
        row["success_minus_k0"] = row["heldout_success"] - lockstep["heldout_success"]
    return rows


def weight_sync(repeats: int, layers: int) -> dict:
    """Disk vs broadcast into one gaca-serve, a Qwen-shaped model of ``layers`` layers."""
    from transformers import AutoTokenizer

    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.transfer import Broadcaster, update_by_broadcast
    from gpu_check import build

    tmp = Path(tempfile.mkdtemp())
    shape = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                 num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                 tie_word_embeddings=True)
    model = build(str(tmp / "model"), shape, "cpu")
    proc, base = start_gaca_serve(str(tmp / "model"), "tiny",
                                  env={"OMP_NUM_THREADS": "1"})
    engine = ServerEngine(base, "tiny", AutoTokenizer.from_pretrained(tmp / "model"),
                          kind="sglang", retries=0, timeout_s=600)
    sender = Broadcaster(engine, timeout_s=600, bucket_bytes=256 << 20, group_name="bench")
    named = list(model.state_dict().items())
    gb = sum(v.numel() * v.element_size() for _, v in named) / 2**30
    disk, cast = [], []
    try:
        for r in range(repeats):
            t0 = time.perf_counter()
            model.save_pretrained(tmp / f"w{r}")  # what Learner.save_weights writes
            engine.update_weights_from_disk(str(tmp / f"w{r}"), f"disk-v{r}", r)
            disk.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            update_by_broadcast(engine, sender, named, f"cast-v{r}", r)
            cast.append(time.perf_counter() - t0)
    finally:
        sender.close()
        proc.kill()
    row = {"gb": round(gb, 3), "disk_s": statistics.median(disk),
           "broadcast_s": statistics.median(cast)}
    row.update(disk_s_per_gb=row["disk_s"] / gb, broadcast_s_per_gb=row["broadcast_s"] / gb,
               broadcast_vs_disk=row["disk_s"] / row["broadcast_s"])
    print(json.dumps({"weight_sync": row}), flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suites", nargs="+", default=["diag", "alfworld"], choices=list(SUITES))
    p.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layers", type=int, default=8, help="the sync model's layers")
    p.add_argument("--sync-only", action="store_true")
    p.add_argument("overrides", nargs="*", help="key=value settings after the benchmark's "
                                                "own (e.g. env.groups=8 warmup.bc_steps=150)")
    p.add_argument("--no-pin", action="store_true", help="do not pin server/learner to cores")
    args = p.parse_args(argv)
    if 0 not in args.staleness:
        p.error("--staleness must include 0 (the lock-step baseline)")
    cores = (None, None) if args.no_pin or (os.cpu_count() or 1) < 2 else (0, 1)
    out = Path(tempfile.mkdtemp(prefix="bench_async-"))
    rows = [] if args.sync_only else training(args.suites, args.staleness, args.seeds,
                                                args.iterations, out, cores, args.overrides)
    sync = weight_sync(args.repeats, args.layers)
    print(json.dumps({"summary": {"training": rows, "weight_sync": sync}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
