"""``gaca-study``: the command line of :mod:`gaca_agent.analysis.study`."""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gaca_agent.analysis import study as _module
from gaca_agent.analysis.study import PRESETS, aggregate, execute, paired, plan, screened_seeds
from gaca_agent.analysis.study_report import markdown, paired_markdown, plot, seed_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-study", description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="full", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, default=Path("runs/study"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs at once, one thread each (default: the cores)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    preset = PRESETS[args.preset]
    runs = plan(preset, screened_seeds(preset, args.out, args.jobs))
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for i, (run, ok, message) in enumerate(pool.map(lambda r: execute(r, args.out), runs), 1):
            print(f"[{i}/{len(runs)}] {run.name}: {message}", flush=True)
            if not ok:
                failed.append(run.name)
    summary = aggregate(args.out, runs)
    previous = args.out / "summary.json"  # a resumed study adds up its sessions' time
    spent = json.loads(previous.read_text()).get("wall_time_s", 0.0) if previous.exists() else 0.0
    comparison = paired(args.out, runs, preset.pairs) if preset.pairs else {}
    summary_meta = {"preset": args.preset, "runs": len(runs), "failed": failed,
                    "wall_time_s": round(spent + time.time() - start, 1), "results": summary,
                    "paired": comparison}
    if (args.out / "screen.json").exists():  # which seeds the preset's rule admitted, and why
        summary_meta["screen"] = json.loads((args.out / "screen.json").read_text())
    (args.out / "summary.json").write_text(json.dumps(summary_meta, indent=2))
    table = markdown(summary) + ("\n" + paired_markdown(comparison) if comparison else "")
    if preset.pairs:
        table += "\n" + seed_markdown(args.out, runs)
    (args.out / "table.md").write_text(table + "\n")
    for path in plot(summary, args.out):
        print(f"wrote {path}")
    print(table)
    print(f"study: {len(runs)} runs, {len(failed)} failed, {summary_meta['wall_time_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
