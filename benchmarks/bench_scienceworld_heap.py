"""ScienceWorld's JVM heap and its expert's gold paths, measured in fresh processes.

    python benchmarks/bench_scienceworld_heap.py --heaps none,512m,768m --rounds 2

Each (round, heap) runs in its own process (its own JVM), heaps interleaved round by
round so machine noise hits them alike: the expert plays the first test variation of
each chosen task type to the end, the process rotating the task order by its round (what
the JVM ran before differs). Reported per heap: median step time, the largest memory of
the process (Python + JVM) after an episode, wins; per task: the gold path's length in
every process (the same in all of them, or not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TYPES = ("boil", "grow-fruit", "mendelian-genetics-known-plant",
         "measure-melting-point-unknown-substance", "chemistry-mix")


def child(heap: str | None, types: list[str]) -> dict:
    import gymnasium as gym

    from bench_env_server import rss_mb

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make("gaca/ScienceWorld-v0", split="test", task_types=",".join(types),
                   jvm_heap=heap, envs_per_jvm=1, max_episode_steps=None)
    u = env.unwrapped
    java = u._engine.pid
    first: dict[str, int] = {}
    for k, v in enumerate(u.variations):
        first.setdefault(v.task_type, k)
    out = {"heap": heap, "steps_s": [], "rss_mb": [], "episodes": {}}
    for task in types:
        env.reset(options={"task_id": first[task]})
        won, n = False, 0
        while n < 300 and (action := u.expert_action()) is not None:
            t0 = time.perf_counter()
            *_, term, _, info = env.step(action)
            out["steps_s"].append(time.perf_counter() - t0)
            n += 1
            if term:
                won = bool(info.get("won"))
                break
        out["episodes"][task] = {"gold": len(u._gold.get(first[task], ())), "steps": n,
                                 "won": won}
        out["rss_mb"].append(rss_mb(os.getpid()) + rss_mb(java))
    env.close()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heaps", default="none,512m,768m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    types = args.types.split(",")
    if args.child is not None:
        heap = None if args.child == "none" else args.child
        print(json.dumps(child(heap, types)))
        return 0
    here = str(Path(__file__).parent)
    runs: list[dict] = []
    for r in range(args.rounds):
        order = types[r % len(types):] + types[:r % len(types)]
        for heap in args.heaps.split(","):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--child", heap, "--types",
                                   ",".join(order)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": here}, check=True)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["round"], run["wall_s"] = r, time.perf_counter() - t0
            runs.append(run)
            print(f"round {r} heap {heap}: {run['wall_s']:.0f} s, max "
                  f"{max(run['rss_mb']):.0f} MB, " + ", ".join(
                      f"{t} gold {e['gold']} {'won' if e['won'] else 'lost'}"
                      for t, e in run["episodes"].items()), flush=True)
    summary = {"heaps": {}, "gold": {}}
    for heap in args.heaps.split(","):
        mine = [r for r in runs if str(r["heap"] or "none") == heap]
        summary["heaps"][heap] = {
            "step_median_ms": 1e3 * statistics.median(s for r in mine for s in r["steps_s"]),
            "rss_max_mb": max(m for r in mine for m in r["rss_mb"]),
            "wins": sum(e["won"] for r in mine for e in r["episodes"].values()),
            "episodes": sum(len(r["episodes"]) for r in mine)}
    for task in types:
        summary["gold"][task] = [r["episodes"][task]["gold"] for r in runs]
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
