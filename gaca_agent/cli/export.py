"""``gaca-export``: the command line of :mod:`gaca_agent.integrations.datasets`.

    gaca-export runs/default --to runs/default-dataset
    gaca-export runs/eval/alf --to alf-steps --estimators gaca,gigpo,grpo
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gaca_agent.cli import fail
from gaca_agent.integrations import datasets as _module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-export", description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a training run, gaca-eval folder or file")
    parser.add_argument("--to", type=Path, required=True, help="the dataset folder to write")
    parser.add_argument("--estimators", default="all",
                        help="estimators to score every step with (comma-separated; "
                             "'all', the default, or 'none')")
    parser.add_argument("--iteration", type=int, default=None,
                        help="export one training iteration (default: every one kept)")
    args = parser.parse_args(argv)
    from gaca_agent.advantages import names

    wanted = {"all": names(), "none": []}.get(
        args.estimators, [e.strip() for e in args.estimators.split(",") if e.strip()])
    unknown = [e for e in wanted if e not in names()]
    if unknown:
        return fail("gaca-export", f"unknown estimator(s) {unknown}; valid: {names()}")
    if args.to.exists() and any(args.to.iterdir()):
        return fail("gaca-export", f"{args.to} exists and is not empty: choose another folder")
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        return fail("gaca-export", "needs the datasets package (pip install datasets)")
    try:
        n = _module.export(args.path, args.to, wanted, args.iteration)
    except (ValueError, FileNotFoundError, KeyError) as err:
        return fail("gaca-export", str(err))
    print(f"wrote {n} steps to {args.to} (datasets.load_from_disk; steps.parquet)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
