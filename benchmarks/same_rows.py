"""Does a refactor leave training unchanged? The default config (lock-step, 4 iterations)
and an asynchronous Diag run (``max_staleness: 1``, rollouts on a ``gaca-serve`` process,
weights broadcast: bench_async's setting, 3 iterations) trained by two checkouts, and
their ``metrics.jsonl`` rows compared key by key, timings left out.

    python benchmarks/same_rows.py OLD_CHECKOUT NEW_CHECKOUT [--out DIR]

Each run uses its checkout's own ``gaca_agent`` (first on PYTHONPATH). Prints, per run,
the keys that differ and the largest difference; rollouts, held-out success and the
staleness columns should be equal, and the default config's rows bit-identical (the
asynchronous run's losses can differ in float rounding between two runs of one
checkout: the server answers in whatever order its batches form)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TIMING = ("perf/", "sync/seconds", "async/wait_s")
ASYNC = """
import sys
from pathlib import Path
root, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path[:0] = [str(root / "benchmarks"), str(root)]
import bench_async as b
from gaca_agent.policies.tiny_model import cached_tiny_model
from serve_process import start_gaca_serve
proc, base = start_gaca_serve(str(cached_tiny_model(0)), "tiny", env={"OMP_NUM_THREADS": "1"})
try:
    b.train(out, "async", [*b.COMMON, *b.SUITES["diag"], "seed=0", "iterations=3",
                           "max_staleness=1", f"server.base_url={base}"], None)
finally:
    proc.kill()
"""


def train(tree: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config",
                    "default", f"out_dir={out}", "name=default", "iterations=4"],
                   cwd=tree, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", ASYNC, str(tree), str(out)], cwd=tree, env=env,
                   check=True, capture_output=True)


def differences(a: Path, b: Path) -> dict[str, float]:
    """Every non-timing key whose value differs in some row: the largest difference."""
    rows = [[json.loads(x) for x in p.read_text().splitlines()] for p in (a, b)]
    if len(rows[0]) != len(rows[1]):
        return {"(rows)": abs(len(rows[0]) - len(rows[1]))}
    out: dict[str, float] = {}
    for ra, rb in zip(*rows):
        for key in sorted(set(ra) | set(rb)):
            if key.startswith(TIMING) or ra.get(key) == rb.get(key):
                continue
            try:
                gap = abs(float(ra[key]) - float(rb[key]))
            except (KeyError, TypeError, ValueError):
                gap = float("inf")
            out[key] = max(out.get(key, 0.0), gap)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--out", type=Path, default=Path("runs/same_rows"))
    args = p.parse_args(argv)
    for side, tree in (("old", args.old), ("new", args.new)):
        train(tree.resolve(), (args.out / side).resolve())
    for run in ("default", "async"):
        diff = differences(*(args.out / side / run / "metrics.jsonl" for side in ("old", "new")))
        print(json.dumps({"run": run, "differing": diff}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
