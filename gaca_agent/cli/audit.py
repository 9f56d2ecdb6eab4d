"""``gaca-audit``: the command line of :mod:`gaca_agent.analysis.audit`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gaca_agent.analysis import audit as _module
from gaca_agent.analysis.audit import audit, load_rows, lone_rollouts, markdown, plot
from gaca_agent.cli import fail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-audit", description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="episodes.jsonl files, gaca-eval/suite folders or training runs")
    parser.add_argument("--similarity", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=None, help="default: the first path's folder")
    args = parser.parse_args(argv)
    if not 0 < args.similarity <= 1:
        return fail("gaca-audit", "--similarity must be in (0, 1]")
    try:
        rows = load_rows(args.paths)
    except FileNotFoundError as err:
        return fail("gaca-audit", str(err))
    if not rows:
        return fail("gaca-audit", "no step rows in the given episodes")
    lone = lone_rollouts(rows)
    if lone:
        return fail("gaca-audit", lone)
    result = audit(rows, args.similarity)
    out = args.out or (args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps(
        {"similarity": args.similarity, "paths": [str(p) for p in args.paths],
         "results": result}, indent=2))
    table = markdown(result)
    (out / "audit.md").write_text(table + "\n")
    try:
        plot(result, out / "audit.png")
    except ImportError:
        pass
    print(table)
    print(f"wrote {out}/audit.json, audit.md, audit.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
