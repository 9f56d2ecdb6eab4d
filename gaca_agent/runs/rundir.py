"""What a training run writes: atomic checkpoints, ``metrics.jsonl`` and TensorBoard, and
the rollouts of every iteration (``rollouts/iter-XXXXX.rankR.jsonl.gz``, for
``gaca-rescore``)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    path = run_dir / "checkpoints" / name
    return (int(name.split("-")[1]), path) if path.is_dir() else None


def resume_hint(run_dir: Path) -> str:
    """What ``gaca-train --resume`` continues ``run_dir`` from, in words."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return f"no checkpoint yet: gaca-train --resume {run_dir} starts it over"
    return (f"the latest checkpoint, {latest[1].name}, is intact: gaca-train --resume "
            f"{run_dir} continues from it")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(learner, run_dir: Path, iteration: int, keep: int,
                    extra: Callable[[Path], None] | None = None) -> None:
    """Write to a temporary folder, rename it, then move the ``latest`` pointer: a kill
    at any moment leaves the previous checkpoint intact and named. ``extra(folder)``
    writes more of this rank's state into it (asynchronous training's batches)."""
    root = run_dir / "checkpoints"
    final = root / f"iter-{iteration:05d}"
    tmp = root / f".tmp-iter-{iteration:05d}"
    if learner.accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    learner.accelerator.wait_for_everyone()
    try:
        learner.save(tmp)
        if extra is not None:
            extra(tmp)
        learner.accelerator.wait_for_everyone()
    except OSError as err:  # a full disk: the half-written folder goes, the latest stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(err.errno, f"could not write checkpoint {final.name} in {root} "
                                 f"({err.strerror or err})") from err
    if learner.accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_atomic(root / "latest", final.name)
        for old in sorted(root.glob("iter-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    learner.accelerator.wait_for_everyone()


class MetricsLog:
    """``metrics.jsonl`` and the trackers of ``logging`` (:mod:`gaca_agent.runs.trackers`;
    TensorBoard only when installed), written by the main process."""

    def __init__(self, run_dir: Path, main: bool, resume_after: int | None,
                 logging: tuple[str, ...] = ("tensorboard",), name: str = "",
                 project: str = "gaca", config: dict | None = None) -> None:
        from gaca_agent.runs.trackers import open_trackers

        self.main, self.path = main, run_dir / "metrics.jsonl"
        self.trackers: list = []
        if not main:
            return
        if resume_after is not None and self.path.exists():  # drop what the killed run
            kept = [line for line in self.path.read_text().splitlines()  # wrote later
                    if _json_ok(line) and json.loads(line)["iteration"] <= resume_after]
            write_atomic(self.path, "".join(line + "\n" for line in kept))
        kinds = tuple(logging)
        if "tensorboard" in kinds and not _has("tensorboard"):
            kinds = tuple(k for k in kinds if k != "tensorboard")  # jsonl only, as before
        self.trackers = open_trackers(kinds, run_dir, name or run_dir.name, project,
                                      config or {})

    def log(self, iteration: int, metrics: dict[str, Any]) -> None:
        if not self.main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in self.trackers:
            tracker.log(scalars, iteration + 1)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (none when absent); a line left unfinished by
    a kill, or by a write in progress, is skipped as :class:`MetricsLog` drops it."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if _json_ok(line)]


def eval_points(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """A run's held-out evaluations as (iteration, success), in iteration order (-1: the
    one after the warm-up)."""
    return sorted((r["iteration"], r["eval/success"]) for r in rows if "eval/success" in r)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _json_ok(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def write_rollouts(run_dir: Path, iteration: int, rank: int,
                   records: Iterable[dict[str, Any]]) -> Path:
    """One rank's episode records of one iteration, gzipped JSON lines (written to a
    temporary name and renamed)."""
    folder = run_dir / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"iter-{iteration:05d}.rank{rank}.jsonl.gz"
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return path
