"""``gaca-eval``: the command line of :mod:`gaca_agent.eval.evaluate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gaca_agent.eval import evaluate as _module
from gaca_agent.eval.evaluate import EvaluationInterrupted, evaluate
from gaca_envs.kv import parse_pairs


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gaca-eval", description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", help="a gaca/ env id")
    parser.add_argument("--env-kwargs", nargs="*", default=[], help="key=value ...")
    parser.add_argument("--policy", help="random, expert, hf:PATH, smollm2, "
                        "openai:BASE_URL#MODEL, human, python:MODULE:FACTORY")
    parser.add_argument("--policy-kwargs", nargs="*", default=[], help="key=value ...")
    parser.add_argument("--episodes", default=None,
                        help="a number, or 'all' (default 10; with --suite, each part's own)")
    parser.add_argument("--group-size", type=int, default=1,
                        help="play each planned episode this many times from the same seed "
                             "(task groups, as in training; for gaca-audit)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--env-servers", nargs="+", default=None, metavar="URL",
                        help="play on these gaca-env-serve servers of --env instead of local "
                             "worker processes (token: $GACA_ENV_TOKEN)")
    parser.add_argument("--max-live-envs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--suite", default=None, help="run a named suite (see --list-suites)")
    parser.add_argument("--list-suites", action="store_true")
    parser.add_argument("--compare", nargs="+", type=Path, default=None,
                        help="print evaluations or suites side by side")
    return parser


def main(argv: list[str] | None = None) -> int:
    from gaca_agent.eval import suites

    parser_ = parser()
    args = parser_.parse_args(argv)

    if args.list_suites:
        for name, suite in suites.SUITES.items():
            print(f"{name} (v{suite.version}): {suite.description}")
        return 0
    if args.compare:
        print(suites.compare(args.compare))
        return 0
    if not args.policy:
        parser_.error("--policy is required")
    try:
        policy_kwargs = parse_pairs(args.policy_kwargs, "policy kwarg")
        env_kwargs = parse_pairs(args.env_kwargs, "env kwarg")
    except ValueError as err:
        parser_.error(str(err))
    try:
        if args.suite:
            out = args.out or Path("runs") / "suites" / args.suite
            table = suites.run_suite(args.suite, args.policy, out, workers=args.workers,
                                     seed=args.seed, policy_kwargs=policy_kwargs,
                                     max_live_envs=args.max_live_envs,
                                     episodes=args.episodes)
            print(table)
            return 0
        if not args.env:
            parser_.error("--env (or --suite) is required")
        name = f"{args.env.split('/')[-1]}-{args.policy.replace(':', '_').replace('/', '_')}"
        out = args.out or Path("runs") / "eval" / name
        results = evaluate(args.env, env_kwargs, args.policy, args.episodes or "10", out,
                           args.workers, args.seed, policy_kwargs, args.max_live_envs,
                           group_size=args.group_size, env_servers=args.env_servers)
    except EvaluationInterrupted as stop:
        print(f"\n{stop}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except ValueError as err:
        parser_.error(str(err))
    print(json.dumps({k: results[k] for k in ("n", "failed", "success_rate", "success_ci95",
                                              "mean_score", "mean_steps")}, indent=2))
    print(f"wrote {out}/results.json, episodes.jsonl, report.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
