"""``gaca-eval``: evaluate any policy on any ``gaca/`` env or named suite.

    gaca-eval --env gaca/ALFWorld-v0 --env-kwargs split=valid_seen --policy expert \\
              --episodes all --workers 2 --out runs/eval/expert
    gaca-eval --suite alfworld --policy hf:runs/x/final --out runs/suite/x
    gaca-eval --compare runs/suite/x runs/suite/y

Episode i plays task ``i % num_tasks`` with seed ``seed + i``; ``--episodes all`` covers
every task of the split once, in task-id order. Episodes are appended to
``episodes.jsonl`` as they finish, so re-running with the same ``--out`` skips finished
ones (failed ones are played again). Writes ``results.json``, ``episodes.jsonl`` and
``report.html``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gaca_agent.results import drop_partial_line, episode_record, read_episodes, summarize


def parse_kv(items: list[str] | None) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def num_tasks_of(env_id: str, env_kwargs: dict[str, Any]) -> int:
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make(env_id, **env_kwargs)
    try:
        return int(env.unwrapped.num_tasks)
    finally:
        env.close()


def plan(episodes: str | int, num_tasks: int, seed: int) -> list[tuple[int, int]]:
    """(task_id, seed) of every episode index."""
    n = num_tasks if str(episodes) == "all" else int(episodes)
    if n < 1:
        raise SystemExit("--episodes must be a positive number or 'all'")
    return [(i % num_tasks, seed + i) for i in range(n)]


def evaluate(env_id: str, env_kwargs: dict[str, Any], policy_spec: str, episodes: str | int,
             out: Path, workers: int = 1, seed: int = 0, policy_kwargs: dict | None = None,
             max_live_envs: int = 16, history_length: int = 2, progress: bool = True,
             policy=None) -> dict[str, Any]:
    """Run (or resume) one evaluation into ``out``; returns the results dict."""
    from tqdm import tqdm

    from gaca_agent.collector import Collector, CollectorConfig
    from gaca_agent.policies import make_policy
    from gaca_agent.report import render_report

    out.mkdir(parents=True, exist_ok=True)
    meta = {"env": env_id, "env_kwargs": env_kwargs, "policy": policy_spec,
            "episodes": str(episodes), "seed": seed}
    config_path = out / "config.json"
    if config_path.exists():
        previous = json.loads(config_path.read_text())
        if previous != meta:
            raise SystemExit(f"{out} holds another evaluation ({previous}); use a new --out")
    config_path.write_text(json.dumps(meta, indent=2))
    episodes_path = out / "episodes.jsonl"
    drop_partial_line(episodes_path)
    records = read_episodes(episodes_path)
    todo = [(i, task) for i, task in enumerate(plan(episodes, num_tasks_of(env_id, env_kwargs),
                                                     seed))
            if i not in records or records[i]["failed"]]
    if todo:
        policy = policy or make_policy(policy_spec, **(policy_kwargs or {}))
        collector = Collector(CollectorConfig(env_id, env_kwargs, num_workers=workers,
                                              max_live_envs=min(max_live_envs, len(todo)),
                                              history_length=history_length))
        bar = tqdm(total=len(todo), desc=f"{policy_spec} on {env_id}", disable=not progress)
        index_of = {g: i for g, (i, _) in enumerate(todo)}
        with open(episodes_path, "a") as f:
            def write(ep):
                record = episode_record(index_of[ep.group], ep)
                records[record["index"]] = record
                f.write(json.dumps(record) + "\n")
                f.flush()
                bar.update(1)
            try:
                collector.run(policy, [task for _, task in todo], 1, on_episode=write)
            finally:
                collector.close()
                bar.close()
    results = summarize(records.values(), {**meta, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.html").write_text(render_report(results, records.values(),
                                                   f"{policy_spec} on {env_id}"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", help="a gaca/ env id")
    parser.add_argument("--env-kwargs", nargs="*", default=[], help="key=value ...")
    parser.add_argument("--policy", help="random, expert, hf:PATH, smollm2, "
                        "openai:BASE_URL#MODEL, human, python:MODULE:FACTORY")
    parser.add_argument("--policy-kwargs", nargs="*", default=[], help="key=value ...")
    parser.add_argument("--episodes", default="10", help="a number, or 'all'")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-live-envs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--suite", default=None, help="run a named suite (see --list-suites)")
    parser.add_argument("--list-suites", action="store_true")
    parser.add_argument("--compare", nargs="+", type=Path, default=None,
                        help="print evaluations or suites side by side")
    args = parser.parse_args(argv)
    from gaca_agent import suites

    if args.list_suites:
        for name, suite in suites.SUITES.items():
            print(f"{name} (v{suite.version}): {suite.description}")
        return 0
    if args.compare:
        print(suites.compare(args.compare))
        return 0
    if not args.policy:
        parser.error("--policy is required")
    policy_kwargs = parse_kv(args.policy_kwargs)
    if args.suite:
        out = args.out or Path("runs") / "suites" / args.suite
        table = suites.run_suite(args.suite, args.policy, out, workers=args.workers,
                                 seed=args.seed, policy_kwargs=policy_kwargs,
                                 max_live_envs=args.max_live_envs)
        print(table)
        return 0
    if not args.env:
        parser.error("--env (or --suite) is required")
    out = args.out or Path("runs") / "eval" / f"{args.env.split('/')[-1]}-{args.policy.replace(':', '_').replace('/', '_')}"
    results = evaluate(args.env, parse_kv(args.env_kwargs), args.policy, args.episodes, out,
                       args.workers, args.seed, policy_kwargs, args.max_live_envs)
    print(json.dumps({k: results[k] for k in ("n", "failed", "success_rate", "success_ci95",
                                              "mean_score", "mean_steps")}, indent=2))
    print(f"wrote {out}/results.json, episodes.jsonl, report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
