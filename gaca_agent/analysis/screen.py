"""Which seeds enter a study: a rule fixed before it runs, applied to the warm-up alone.

A seed's warm-up (behaviour cloning on random-action transcripts) and its held-out
evaluation do not depend on the estimator, so one short run per seed (the warm-up, its
evaluation and a single iteration) tells whether the seed can take part. The seeds of
the pool are screened in order, ``jobs`` at a time, until ``keep`` of them have a warm-up
held-out success strictly inside the rule's bounds; the others are reported with their
score and not trained. ``screen.json`` in the study directory keeps every verdict, and a
resumed study reuses the finished screening runs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gaca_agent.runs.rundir import eval_points, read_metrics


@dataclass(frozen=True)
class Screen:
    """Seeds of ``pool``, in order, until ``keep`` have ``low < warm-up success < high``."""

    pool: tuple[int, ...]
    keep: int
    low: float = 0.0
    high: float = 1.0

    def admits(self, success: float) -> bool:
        return self.low < success < self.high


def warmup_success(rows: Sequence[dict]) -> float | None:
    """Held-out success right after the warm-up (the row of iteration -1), if logged."""
    return next((float(v) for it, v in eval_points(list(rows)) if it == -1), None)


def screen(rule: Screen, env_label: str, overrides: Sequence[str], out: Path, jobs: int,
           execute: Callable, make_run: Callable[[int, list[str]], Any]) -> list[int]:
    """The kept seeds of one environment, in pool order; writes ``screen.json``.

    ``make_run(seed, overrides)`` builds the screening run, ``execute(run, folder)`` runs it
    (as the study runs its own, so a finished one is skipped)."""
    short = [*overrides, "iterations=1", "eval_every=1", "checkpoint_every=0"]
    verdicts: dict[str, dict[str, Any]] = {}
    kept: list[int] = []
    seeds = iter(rule.pool)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while len(kept) < rule.keep:
            batch = list(itertools.islice(seeds, max(1, min(jobs, rule.keep - len(kept)))))
            if not batch:
                break
            runs = [make_run(seed, short) for seed in batch]
            for seed, (run, ok, message) in zip(batch, pool.map(
                    lambda r: execute(r, out / "screen"), runs)):
                score = warmup_success(read_metrics(out / "screen" / "runs" / run.name)) \
                    if ok else None
                admitted = score is not None and rule.admits(score)
                verdicts[str(seed)] = {"warmup_success": score, "kept": admitted}
                if admitted:
                    kept.append(seed)
                print(f"screen {env_label} seed {seed}: warm-up held-out success {score} -> "
                      f"{'kept' if admitted else 'excluded'}", flush=True)
    if len(kept) < rule.keep:
        print(f"screen {env_label}: the pool gave {len(kept)} of {rule.keep} seeds; the study "
              "runs with those", flush=True)
    path = out / "screen.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    record[env_label] = {"rule": asdict(rule), "seeds": verdicts, "kept": kept}
    path.write_text(json.dumps(record, indent=2))
    return kept
