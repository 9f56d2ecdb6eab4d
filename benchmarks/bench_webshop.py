"""WebShop text-mode step latency and search latency on a 1,000-product catalogue.

Episodes on the generated catalogue cut to 1,000 products (``num_products=1000``), test
goals; each episode mixes the expert's actions with random admissible clicks (so
searches, result pages, item pages, options and sub-pages all occur). Step latency is
``env.step`` through ``gymnasium.make`` (TimeLimit and checks included); search latency is
the BM25 query alone, on the human queries of ``goal_query_map.json`` when present.

    python benchmarks/bench_webshop.py [--episodes 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
import numpy as np

import gaca_envs
from gaca_envs.data import data_path

gym.register_envs(gaca_envs)


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--mode", default="text", choices=["text", "text_rich", "html"])
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    env = gym.make("gaca/WebShop-v0", split="test", num_products=1000,
                   observation_mode=args.mode)
    build = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    steps, searches_in_env, buys, resets = [], [], [], []
    for ep in range(args.episodes):
        s = time.perf_counter()
        obs, info = env.reset(options={"task_id": ep % env.unwrapped.num_tasks})
        resets.append(time.perf_counter() - s)
        for _ in range(15):
            action = env.unwrapped.expert_action()
            clicks = [a for a in info["admissible_actions"] if a.startswith("click[")
                      and a != "click[buy now]"]
            if clicks and rng.random() < 0.3:
                action = clicks[int(rng.integers(len(clicks)))]
            s = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            dt = time.perf_counter() - s
            kind = (searches_in_env if action.startswith("search[") else
                    buys if action == "click[buy now]" else steps)
            kind.append(dt)
            if terminated or truncated:
                break
    every = steps + searches_in_env + buys
    search = env.unwrapped.world.search
    path = data_path("webshop", "goal_query_map.json")
    queries = ([q for qs in json.loads(path.read_text()).values() for q in qs][:1000]
               if path else [g["instruction_text"] for g in env.unwrapped.world.goals[:1000]])
    search_times = []
    for q in queries:
        s = time.perf_counter()
        search.search(q)
        search_times.append(time.perf_counter() - s)
    report = {
        "catalogue_products": len(env.unwrapped.world.catalog.products),
        "world_build_s": round(build, 2),
        "steps": len(every),
        "step_median_ms": round(pct(every, 50), 3), "step_p90_ms": round(pct(every, 90), 3),
        "click_step_median_ms": round(pct(steps, 50), 3),
        "search_step_median_ms": round(pct(searches_in_env, 50), 3),
        "buy_step_median_ms": round(pct(buys, 50), 3),
        "reset_median_ms": round(pct(resets, 50), 3),
        "bm25_query_median_ms": round(pct(search_times, 50), 3),
        "bm25_query_p90_ms": round(pct(search_times, 90), 3),
        "queries": len(queries), "query_source": "goal_query_map.json" if path else "goals",
        "mean_steps_per_episode": round(len(every) / args.episodes, 2),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
