"""Collector throughput: env-steps/s with 1 and 2 worker processes on ALFWorld.

The same episodes both times (random policy, ``--episodes`` valid_seen tasks, 8 envs
live, ALFWorld's 50-step budget), run one after the other in one process; the
translation cache is warmed first so both runs pay the same reset costs.

    python benchmarks/bench_collector.py [--episodes 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gaca_agent.policies import make_policy
from gaca_agent.collect.collector import Collector
from gaca_agent.config import EnvSection


def run(workers: int, tasks, live: int) -> tuple[float, int]:
    collector = Collector(EnvSection(id="gaca/ALFWorld-v0", kwargs={"split": "valid_seen"},
                                     workers=workers, max_live_envs=live, invalid_penalty=0.0))
    try:
        collector.pool  # start the workers before the clock
        collector.run(make_policy("random", seed=0), tasks[:workers], 1)  # import warm-up
        start = time.perf_counter()
        episodes = collector.run(make_policy("random", seed=1), tasks, 1).episodes
        elapsed = time.perf_counter() - start
    finally:
        collector.close()
    assert not any(e.failed for e in episodes)
    return elapsed, sum(e.length for e in episodes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--live", type=int, default=8)
    args = parser.parse_args(argv)
    tasks = [(k * 7 % 140, k) for k in range(args.episodes)]
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make("gaca/ALFWorld-v0", split="valid_seen")
    for task, _ in tasks:  # warm the on-disk translation cache
        env.reset(options={"task_id": task})
    env.close()
    report = {}
    for workers in (1, 2):
        elapsed, steps = run(workers, tasks, args.live)
        report[f"{workers}_workers"] = {"seconds": round(elapsed, 2), "env_steps": steps,
                                        "env_steps_per_s": round(steps / elapsed, 1)}
        print(workers, report[f"{workers}_workers"], flush=True)
    report["speedup_2_vs_1"] = round(report["2_workers"]["env_steps_per_s"]
                                     / report["1_workers"]["env_steps_per_s"], 2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
