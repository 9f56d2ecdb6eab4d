"""``gaca-eval``: the command line of :mod:`gaca_agent.eval.evaluate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gaca_agent.cli import fail
from gaca_agent.config.checks import (InputError, check_env, check_env_builds, check_policy,
                                      check_run_inputs)
from gaca_agent.eval import evaluate as _module
from gaca_agent.eval.evaluate import (Evaluation, EvaluationFailed, EvaluationInterrupted,
                                      eval_policy_kwargs, evaluate)
from gaca_envs.kv import parse_pairs

PROG = "gaca-eval"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", help="a gaca/ env id, or MODULE:ID for your own (MODULE "
                        "registers ID with gymnasium)")
    parser.add_argument("--env-kwargs", nargs="*", default=[], help="key=value ...")
    parser.add_argument("--policy", help="random, expert, hf:PATH, smollm2, "
                        "openai:BASE_URL#MODEL, human, python:MODULE:FACTORY")
    parser.add_argument("--policy-kwargs", nargs="*", default=[],
                        help="key=value ... (model policies: temperature, default 0.4, "
                             "and max_new_tokens; hf: and smollm2 also dtype=bfloat16)")
    parser.add_argument("--episodes", default=None,
                        help="a number, or 'all' (default 10; with --suite, each part's own)")
    parser.add_argument("--group-size", type=int, default=1,
                        help="play each planned episode this many times from the same seed "
                             "(task groups, as in training; for gaca-audit)")
    parser.add_argument("--workers", type=int, default=1,
                        help="env worker processes (0: the envs run in this process)")
    parser.add_argument("--env-servers", nargs="+", default=None, metavar="URL",
                        help="play on these gaca-env-serve servers of --env instead of local "
                             "worker processes (token: $GACA_ENV_TOKEN)")
    parser.add_argument("--max-live-envs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None, metavar="OUT",
                        help="continue the evaluation in OUT with its own env, policy, "
                             "episodes and seed (its config.json)")
    parser.add_argument("--suite", default=None, help="run a named suite (see --list-suites)")
    parser.add_argument("--list-suites", action="store_true")
    parser.add_argument("--compare", nargs="+", type=Path, default=None,
                        help="print evaluations or suites side by side; two evaluations "
                             "of the same episodes also compared pair by pair (exact sign "
                             "test)")
    parser.add_argument("--leaderboard", nargs="+", type=Path, default=None, metavar="PATH",
                        help="tables of every gaca-eval folder and gaca-train run under "
                             "PATH, one per protocol, with Wilson intervals (written to "
                             "--out as Markdown when given)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (as gaca-train's): logs of long evaluations "
                             "keep only their results")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the inputs (env, kwargs, data, policy, model, servers), "
                             "say what would be played, then exit")
    return parser


def tables(args) -> int | None:
    """``--list-suites``, ``--compare`` and ``--leaderboard``: print (and write) tables of
    what exists, play nothing; None when none of them was asked for."""
    from gaca_agent.eval import suites

    if args.list_suites:
        for name, suite in suites.SUITES.items():
            print(f"{name} (v{suite.version}): {suite.description}")
        return 0
    if args.compare:
        print(suites.compare(args.compare))
        if len(args.compare) == 2:  # two evaluations of the same episodes: paired
            from gaca_agent.analysis.paired import paired_line

            line = paired_line(*args.compare)
            if line:
                print(line)
        return 0
    if args.leaderboard:
        from gaca_agent.eval.leaderboard import write

        try:
            print(write(args.leaderboard, args.out))
        except (ValueError, OSError, KeyError) as err:
            return fail(PROG, err)
        return 0
    return None


def main(argv: list[str] | None = None) -> int:
    from gaca_agent.eval import suites

    parser_ = parser()
    args = parser_.parse_args(argv)

    listed = tables(args)
    if listed is not None:
        return listed
    if args.resume:
        try:
            resumed(args)
        except InputError as err:
            return fail(PROG, err)
    if not args.policy:
        return fail(PROG, "--policy is required")
    if not args.suite and not args.env:
        return fail(PROG, "--env (or --suite) is required")
    try:
        policy_kwargs = parse_pairs(args.policy_kwargs, "policy kwarg")
        env_kwargs = parse_pairs(args.env_kwargs, "env kwarg")
        check_inputs(args, env_kwargs, policy_kwargs)
        if args.dry_run:
            print(dry_run(args, env_kwargs, policy_kwargs))
            return 0
    except (InputError, ValueError) as err:
        return fail(PROG, err)
    try:
        if args.suite:
            out = args.out or Path("runs") / "suites" / args.suite
            table = suites.run_suite(args.suite, args.policy, out, workers=args.workers,
                                     seed=args.seed, policy_kwargs=policy_kwargs,
                                     max_live_envs=args.max_live_envs,
                                     episodes=args.episodes, progress=not args.no_progress)
            print(table)
            return 0
        name = f"{args.env.split('/')[-1]}-{args.policy.replace(':', '_').replace('/', '_')}"
        out = args.out or Path("runs") / "eval" / name
        results = evaluate(Evaluation(
            args.env, args.policy, args.episodes or "10", env_kwargs, policy_kwargs,
            args.seed, args.group_size, args.workers, args.max_live_envs,
            env_servers=tuple(args.env_servers or ())), out, progress=not args.no_progress)
    except EvaluationInterrupted as stop:
        print(f"\n{stop}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except EvaluationFailed as err:
        return fail(PROG, err, code=1)
    except ValueError as err:
        return fail(PROG, err)
    print(json.dumps({k: results[k] for k in ("n", "failed", "success_rate", "success_ci95",
                                              "mean_score", "mean_steps")}, indent=2))
    print(f"wrote {out}/results.json, episodes.jsonl, report.html")
    return 0


def resumed(args) -> None:
    """Fill ``args`` from the evaluation in ``args.resume`` (raises InputError)."""
    config = args.resume / "config.json"
    if not config.is_file():
        raise InputError(f"--resume {args.resume}: no evaluation there (no config.json)")
    if args.env or args.policy or args.suite or args.episodes:
        raise InputError("--resume takes the env, policy, episodes and seed of the "
                         "evaluation it continues: leave them out")
    meta = json.loads(config.read_text())
    args.env, args.policy, args.episodes = meta["env"], meta["policy"], meta["episodes"]
    args.seed, args.group_size, args.out = meta["seed"], meta.get("group_size", 1), args.resume
    args.env_kwargs = [f"{k}={json.dumps(v)}" for k, v in meta["env_kwargs"].items()]
    args.policy_kwargs = [f"{k}={json.dumps(v)}" for k, v in
                          meta.get("policy_kwargs", {}).items()]


def check_inputs(args, env_kwargs: dict, policy_kwargs: dict) -> None:
    """The command's inputs, before anything is written (raises InputError)."""
    from gaca_agent.eval import suites

    policy = (args.policy, eval_policy_kwargs(args.policy, policy_kwargs))
    if not args.suite:
        check_run_inputs(args.env, [env_kwargs], servers=args.env_servers or (),
                         policy=policy)
        return
    suite = suites.get_suite(args.suite)
    check_policy(*policy)
    for part in suite.parts:
        check_env(part.env_id, part.env_kwargs, expert=args.policy == "expert")
    first = suite.parts[0]  # built once: a suite's parts share their env's data
    check_env_builds(first.env_id, first.env_kwargs)


def dry_run(args, env_kwargs: dict, policy_kwargs: dict) -> str:
    """What the command would play (its inputs checked)."""
    from gaca_agent.eval import suites
    from gaca_agent.eval.evaluate import num_tasks_of, plan

    kwargs = eval_policy_kwargs(args.policy, policy_kwargs)
    head = f"policy {args.policy}" + (f" {kwargs}" if kwargs else "")
    if args.suite:
        suite = suites.get_suite(args.suite)
        parts = ", ".join(f"{p.name} ({args.episodes or p.episodes})" for p in suite.parts)
        return f"{head}\nsuite {args.suite} v{suite.version}: {parts}\ninputs checked"
    n = num_tasks_of(args.env, env_kwargs, args.env_servers)
    planned = plan(args.episodes or "10", n, args.seed)
    where = f"env {args.env}" + (f" {env_kwargs}" if env_kwargs else "")
    return (f"{head}\n{where}: {n if n is not None else 'no'} tasks; {len(planned)} "
            f"episodes x group {args.group_size}\ninputs checked")


if __name__ == "__main__":
    raise SystemExit(main())
