"""Raw ALFWorld engine vs the gaca wrapper: reset and step time on the same games, one run.

Three step timings side by side per game: the raw engine, ``gaca/ALFWorld-v0`` with
TextWorld's own text generation (``fast_textgen=False``) and with the fast one (the
default, :mod:`gaca_envs.alfworld.fastgen`); medians over every step of every game.

Raw engine: ``textworld.start(game, wrappers=[AlfredDemangler, AlfredInfos])`` then
``reset()``, the way ALFWorld's own env loads each episode's game; its ``reset()`` alone
(same game again) is timed too. Wrapper: ``gymnasium.make("gaca/ALFWorld-v0").reset()``
with the translation cache warm (every game seen once before, as in training, where each
game is played many times) and, separately, cold (empty cache). Steps replay each game's
walkthrough in both; the wrapper's figure includes the canonical state key and the info.

    python benchmarks/bench_envs.py --games 10 [--split valid_seen] [--json out.json]

ScienceWorld (``--env scienceworld``): the ``scienceworld`` package's own env (its
``load`` + ``reset``, its ``step``, which returns the valid-action list in its info) vs
``gaca/ScienceWorld-v0`` (its ``reset``, its ``step`` with the state key, the admissible
actions and the info), one JVM each, on the first test variation of ``--types`` evenly
spaced task types, the same gold actions in both (the first ``--steps`` of each),
interleaved; then the memory of one env process (Python + its JVM) over ``--resets``
resets with a few steps each.

    python benchmarks/bench_envs.py --env scienceworld --types 10 --steps 40 --resets 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def raw_episode(path: str, walkthrough_steps: int | None = None):
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    t0 = time.perf_counter()
    env = textworld.start(path, infos, wrappers=[AlfredDemangler(), AlfredInfos])
    state = env.reset()
    t1 = time.perf_counter()
    env.reset()
    t2 = time.perf_counter()
    walkthrough = env._wrapped_env._wrapped_env.walkthrough if hasattr(env, "_wrapped_env") \
        else env.walkthrough
    steps = []
    for action in walkthrough:
        s = time.perf_counter()
        state, _, done = env.step(action)
        steps.append(time.perf_counter() - s)
    assert state["won"], path
    env.close()
    return t1 - t0, t2 - t1, steps


def wrapper_episode(env, task_id: int):
    t0 = time.perf_counter()
    env.reset(options={"task_id": task_id})
    reset = time.perf_counter() - t0
    steps = []
    won = False
    while True:
        action = env.unwrapped.expert_action()
        s = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        steps.append(time.perf_counter() - s)
        won = info["won"]
        if terminated or truncated:
            break
    assert won
    return reset, steps


def scienceworld(args) -> dict:
    import gymnasium as gym
    from bench_env_server import rss_mb
    from scienceworld import ScienceWorldEnv as Raw

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make("gaca/ScienceWorld-v0", split="test", max_episode_steps=None)
    u = env.unwrapped
    raw = Raw("", envStepLimit=10**9)
    first: dict[str, int] = {}
    for k, v in enumerate(u.variations):
        first.setdefault(v.task_type, k)
    types = list(first)[:: max(1, len(first) // args.types)][: args.types]
    steps: dict[str, list[float]] = {"raw": [], "gaca": []}
    resets: dict[str, list[float]] = {"raw": [], "gaca": []}
    sizes: list[int] = []
    for task in types:
        k = first[task]
        env.reset(options={"task_id": k})
        gold = []
        while len(gold) < args.steps and (a := u.expert_action()) is not None:
            gold.append(a)
            *_, term, trunc, _ = env.step(a)
            if term:
                break
        for _ in range(2):  # interleaved: noise hits both sides alike
            t0 = time.perf_counter()
            raw.load(task, u.variations[k].variation, "")
            raw.reset()
            resets["raw"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            env.reset(options={"task_id": k})
            resets["gaca"].append(time.perf_counter() - t0)
            for a in gold:
                t0 = time.perf_counter()
                raw.step(a)
                steps["raw"].append(time.perf_counter() - t0)
            for a in gold:
                t0 = time.perf_counter()
                info = env.step(a)[4]
                steps["gaca"].append(time.perf_counter() - t0)
                sizes.append(len(info["admissible_actions"]))
        print(f"{task:45s} {len(gold):3d} gold steps; median step raw "
              f"{1e3 * statistics.median(steps['raw'][-len(gold):]):6.1f} ms, gaca "
              f"{1e3 * statistics.median(steps['gaca'][-len(gold):]):6.1f} ms", flush=True)
    raw.close()
    # memory of one env process (Python + JVM) over many resets
    java = u._engine.pid
    mem = []
    for i in range(args.resets):
        env.reset(options={"task_id": first[types[i % len(types)]]})
        for _ in range(3):
            env.step("look around")
            env.step("wait1")
        if i in (9, args.resets - 1):
            mem.append(rss_mb(os.getpid()) + rss_mb(java))
    env.close()
    summary = {
        "task_types": len(types), "steps": len(steps["gaca"]),
        "raw_step_median_ms": 1e3 * statistics.median(steps["raw"]),
        "gaca_step_median_ms": 1e3 * statistics.median(steps["gaca"]),
        "raw_step_mean_ms": 1e3 * statistics.mean(steps["raw"]),
        "gaca_step_mean_ms": 1e3 * statistics.mean(steps["gaca"]),
        "raw_reset_median_ms": 1e3 * statistics.median(resets["raw"]),
        "gaca_reset_median_ms": 1e3 * statistics.median(resets["gaca"]),
        "admissible_actions_median": statistics.median(sizes),
        "admissible_actions_max": max(sizes),
        "rss_mb_after_10_resets": mem[0], f"rss_mb_after_{args.resets}_resets": mem[-1],
    }
    summary["step_overhead_median"] = (summary["gaca_step_median_ms"]
                                       / summary["raw_step_median_ms"] - 1)
    summary["step_overhead_mean"] = summary["gaca_step_mean_ms"] / summary["raw_step_mean_ms"] - 1
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=["alfworld", "scienceworld"], default="alfworld")
    parser.add_argument("--games", type=int, default=10)
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--types", type=int, default=10, help="ScienceWorld task types")
    parser.add_argument("--steps", type=int, default=40, help="ScienceWorld gold steps each")
    parser.add_argument("--resets", type=int, default=200, help="ScienceWorld memory check")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.env == "scienceworld":
        summary = scienceworld(args)
        print(json.dumps(summary, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
        return 0

    os.environ["GACA_CACHE"] = tempfile.mkdtemp(prefix="gaca-bench-")  # start cold
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make("gaca/ALFWorld-v0", split=args.split)
    slow_env = gym.make("gaca/ALFWorld-v0", split=args.split, fast_textgen=False)
    games = env.unwrapped.games
    stride = max(1, len(games) // args.games)
    ids = list(range(0, len(games), stride))[: args.games]

    rows = []
    all_steps: dict[str, list[float]] = {"raw": [], "slow": [], "fast": []}
    for k in ids:  # interleaved so that machine noise hits every side alike
        raw_load_reset, raw_reset, raw_steps = raw_episode(str(games[k].path))
        cold, _ = wrapper_episode(env, k)
        warm, steps = wrapper_episode(env, k)
        wrapper_episode(slow_env, k)  # warm its cache too
        _, slow_steps = wrapper_episode(slow_env, k)
        for name, values in (("raw", raw_steps), ("slow", slow_steps), ("fast", steps)):
            all_steps[name] += values
        rows.append({"game": games[k].name, "raw_load_reset_s": raw_load_reset,
                     "raw_reset_s": raw_reset, "wrapper_cold_reset_s": cold,
                     "wrapper_warm_reset_s": warm,
                     "raw_step_ms": 1e3 * statistics.median(raw_steps),
                     "wrapper_slow_step_ms": 1e3 * statistics.median(slow_steps),
                     "wrapper_step_ms": 1e3 * statistics.median(steps)})
        print(f"{games[k].name[:50]:50s} raw {raw_load_reset:5.2f}s/{raw_reset:5.2f}s "
              f"wrapper cold {cold:5.2f}s warm {warm:5.3f}s  median step raw "
              f"{rows[-1]['raw_step_ms']:5.1f} ms, textworld's textgen "
              f"{rows[-1]['wrapper_slow_step_ms']:5.1f} ms, fast {rows[-1]['wrapper_step_ms']:5.1f} ms",
              flush=True)

    def mean(key):
        return statistics.mean(r[key] for r in rows)

    # Warm resets of games that are not the loaded one (new-episode case of training).
    switch = []
    for i, k in enumerate(ids):
        t0 = time.perf_counter()
        env.reset(options={"task_id": ids[(i + 1) % len(ids)]})
        switch.append(time.perf_counter() - t0)
    summary = {
        "games": len(rows), "split": args.split,
        "raw_load_reset_s": mean("raw_load_reset_s"), "raw_reset_s": mean("raw_reset_s"),
        "wrapper_cold_reset_s": mean("wrapper_cold_reset_s"),
        "wrapper_warm_reset_same_game_s": mean("wrapper_warm_reset_s"),
        "wrapper_warm_reset_other_game_s": statistics.mean(switch),
        "steps": len(all_steps["fast"]),
        "raw_step_median_ms": 1e3 * statistics.median(all_steps["raw"]),
        "wrapper_textworld_textgen_step_median_ms": 1e3 * statistics.median(all_steps["slow"]),
        "wrapper_step_median_ms": 1e3 * statistics.median(all_steps["fast"]),
    }
    summary["step_speedup_vs_raw"] = (summary["raw_step_median_ms"]
                                      / summary["wrapper_step_median_ms"])
    summary["step_speedup_vs_textworld_textgen"] = (
        summary["wrapper_textworld_textgen_step_median_ms"] / summary["wrapper_step_median_ms"])
    summary["reset_speedup_vs_raw_load_reset"] = (summary["raw_load_reset_s"]
                                                  / summary["wrapper_warm_reset_other_game_s"])
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
