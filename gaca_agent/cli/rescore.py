"""``gaca-rescore``: the command line of :mod:`gaca_agent.analysis.rescore`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gaca_agent.analysis import rescore as _module
from gaca_agent.analysis.audit import lone_rollouts
from gaca_agent.analysis.rescore import (markdown, parse_params, plot, rescore, rollout_files,
                                         step_rows)
from gaca_agent.cli import fail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-rescore", description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a training run, gaca-eval folder or file")
    parser.add_argument("--estimators", default="grpo,gigpo,gaca,adastep,pgpo")
    parser.add_argument("--iteration", type=int, default=None,
                        help="which training iteration (default: the last kept)")
    parser.add_argument("--anchor", choices=("state", "observation"), default="state")
    parser.add_argument("--params", nargs="*", default=[], help="estimator:key=value ...")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from gaca_agent.advantages import names

    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    unknown = [e for e in estimators if e not in names()]
    if unknown:
        return fail("gaca-rescore", f"unknown estimator(s) {unknown}; valid: {names()}")
    try:
        params = parse_params(args.params)
        files, source = rollout_files(args.path, args.iteration)
        rows = step_rows(files)
        if not rows:
            raise ValueError("no step rows in these episodes")
        lone = lone_rollouts(rows)
        if lone:
            raise ValueError(lone)
        result = rescore(rows, source, estimators, params, args.anchor)
    except (ValueError, FileNotFoundError, TypeError, KeyError) as err:
        return fail("gaca-rescore", str(err))
    out = args.out or (args.path if args.path.is_dir() else args.path.parent) / "rescore"
    out.mkdir(parents=True, exist_ok=True)
    result["source"] = {**source, "files": [str(f) for f in files]}
    try:
        plot(result, out / "rescore.png")
    except ImportError:
        pass
    for key in ("_advantages", "_exact"):  # per-row arrays, not for rescore.json
        result.pop(key)
    (out / "rescore.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (out / "rescore.md").write_text(table + "\n")
    print(table)
    print(f"wrote {out}/rescore.json, rescore.md, rescore.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
