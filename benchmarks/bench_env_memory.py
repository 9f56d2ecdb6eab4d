"""Memory and speed of live episodes at a training batch's size, per suite and layout.

    python benchmarks/bench_env_memory.py --suite scienceworld --live 16,64,128 \\
        --layouts today,shared --seconds 120
    python benchmarks/bench_env_memory.py --suite alfworld --live 16,64,128
    python benchmarks/bench_env_memory.py --suite webshop --live 16,64,128

``--live N`` episodes run at once in the collector's env pool (``EnvPool``: ``--workers``
spawned processes, 8 as in the shipped 128-episode configs, slot j in worker j % 8),
played by the scripted expert (a random admissible action where it has none; ``--policy
random``: random admissible actions only, ScienceWorld's default: its expert replays its
whole gold path before an episode's first step, so at 128 episodes the warm-up alone
would take half an hour on 2 cores), each finished episode replaced by the next task at
once. Reported per (layout, live): the
memory of every process the benchmark started (workers, their JVMs), as the sum of RSS and
of PSS (RSS counts shared library pages once per process), at its largest and at the
end, MB per live episode, and env steps/s over ``--seconds`` after a warm-up in which
every slot has played at least one step.

Layouts: ``shared`` is ours (ScienceWorld: ``envs_per_jvm`` engines per JVM with the
heap sized for them); ``today`` is one JVM per ScienceWorld env with ``-Xmx768m``, the
layout before engines shared JVMs. ALFWorld and WebShop have one layout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reliability_common import alfworld_kwargs, descendants, memory_mb  # noqa: E402

SUITES = {"scienceworld": "gaca/ScienceWorld-v0", "alfworld": "gaca/ALFWorld-v0",
          "webshop": "gaca/WebShop-v0"}
LAYOUTS = {"shared": {}, "today": {"envs_per_jvm": 1, "jvm_heap": "768m"}}


def suite_kwargs(suite: str, layout: str) -> dict:
    if suite == "alfworld":
        return alfworld_kwargs()
    if suite == "scienceworld":
        return {"split": "test", **LAYOUTS[layout]}
    return {}


def choose(info: dict, rng: random.Random) -> str:
    actions = info.get("admissible_actions") or ["look"]
    return rng.choice(list(actions))


def run(suite: str, layout: str, live: int, workers: int, seconds: float,
        policy: str) -> dict:
    from gaca_agent.collect.workers import EnvPool, WorkerFailure

    rng, seed = random.Random(0), iter(range(10**9))
    t_start = time.perf_counter()
    pool = EnvPool(SUITES[suite], suite_kwargs(suite, layout), num_envs=live,
                   num_workers=workers, recycle_after=None, timeout_s=900)
    me = os.getpid()
    peak = (0.0, 0.0)
    slots = list(range(live))
    infos: dict[int, dict] = {}
    failures = episodes = steps = 0
    played: set[int] = set()
    t_measure = None

    def reset(which: list[int]) -> None:
        nonlocal failures
        for s, answer in pool.call("reset", [(s, (next(seed), None)) for s in which]).items():
            if isinstance(answer, WorkerFailure):
                failures += 1
                infos[s] = {}
            else:
                infos[s] = answer[1]

    try:
        reset(slots)
        t_ready = time.perf_counter()
        while t_measure is None or time.perf_counter() - t_measure < seconds:
            experts = pool.call("expert", [(s, None) for s in slots]) if policy == "expert" \
                else dict.fromkeys(slots)
            moves = [(s, a if isinstance(a, str) else choose(infos[s], rng))
                     for s, a in experts.items()]
            done = []
            for s, answer in pool.call("step", moves).items():
                if isinstance(answer, WorkerFailure):
                    failures += 1
                    done.append(s)
                    continue
                _, _, term, trunc, infos[s] = answer
                played.add(s)
                if t_measure is not None:
                    steps += 1
                if term or trunc:
                    done.append(s)
                    episodes += t_measure is not None
            if done:
                reset(done)
            if t_measure is None and len(played) == live:
                t_measure = time.perf_counter()
            now = memory_mb(descendants(me))
            peak = (max(peak[0], now[0]), max(peak[1], now[1]))  # each its own peak
        elapsed = time.perf_counter() - t_measure
        end = memory_mb(descendants(me))
    finally:
        pool.close()
    return {"suite": suite, "layout": layout if suite == "scienceworld" else "-",
            "live": live, "workers": workers,
            "policy": policy,
            "start_s": round(t_ready - t_start, 1), "seconds": round(elapsed, 1),
            "steps": steps, "episodes": episodes, "failures": failures,
            "steps_per_s": round(steps / elapsed, 2),
            "steps_per_s_per_env": round(steps / elapsed / live, 3),
            "rss_peak_mb": round(peak[0]), "pss_peak_mb": round(peak[1]),
            "rss_end_mb": round(end[0]), "pss_end_mb": round(end[1]),
            "pss_peak_mb_per_env": round(peak[1] / live, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), required=True)
    ap.add_argument("--live", default="16,64,128")
    ap.add_argument("--layouts", default="shared")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--policy", choices=["expert", "random"], default=None,
                    help="default: expert (ScienceWorld: random)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    policy = args.policy or ("random" if args.suite == "scienceworld" else "expert")
    rows = []
    for live in (int(n) for n in args.live.split(",")):
        for layout in args.layouts.split(","):  # side by side at each size
            rows.append(run(args.suite, layout, live, args.workers, args.seconds, policy))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
