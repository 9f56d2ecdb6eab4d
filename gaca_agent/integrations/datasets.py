"""A run's or an evaluation's episodes as a Hugging Face ``datasets`` dataset, and back.

One row per step of every episode that did not fail: where it came from (``iteration``,
-1 for an evaluation; ``group``, ``traj``, ``task_id``, ``t``), the texts (``task``,
``observation``, ``response``, ``action``), ``reward``, ``env_reward``, ``penalty``,
``terminated``, ``truncated``, ``action_valid``, ``format_valid``, the canonical ``state_key`` and ``next_state_key``, the
step ``nll`` and ``entropy``, the run's own ``advantage`` and ``weight`` (NaN where the
run did not train on the row), and for every estimator asked for ``advantage_<name>`` and
``weight_<name>`` (each iteration's batch scored as ``gaca-rescore`` scores it). Rollouts
kept with ``keep_rollouts: tokens`` also give ``prompt_ids``, ``response_ids`` and the
sampler's ``logprobs`` (empty lists otherwise).

The folder holds the dataset as ``save_to_disk`` writes it (``datasets.load_from_disk``),
the same rows as ``steps.parquet``, and ``gaca_export.json`` (the source env and kwargs);
``gaca-rescore`` and ``gaca-audit`` read it back.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from gaca_agent.runs.exported import META

def source_files(path: Path, iteration: int | None = None
                 ) -> tuple[list[tuple[int, Path]], dict[str, Any]]:
    """(iteration, file) of every episode file of a run (every iteration, or the one
    asked for) or of an evaluation."""
    from gaca_agent.analysis.rescore import _source

    path = Path(path)
    if path.is_file():
        return [(-1, path)], _source(path.parent)
    files = sorted(path.glob("rollouts/iter-*.jsonl.gz"))
    if files:
        found = [(int(re.search(r"iter-(\d+)", f.name).group(1)), f) for f in files]
        if iteration is not None:
            found = [(it, f) for it, f in found if it == iteration]
            if not found:
                raise ValueError(f"{path} has no rollouts of iteration {iteration}")
        return found, _source(path)
    if (path / "episodes.jsonl").is_file():
        return [(-1, path / "episodes.jsonl")], _source(path)
    raise FileNotFoundError(f"{path} holds neither rollouts/*.jsonl.gz nor episodes.jsonl")


def step_table(path: Path, estimators: Iterable[str] = (), iteration: int | None = None
               ) -> tuple[dict[str, list], dict]:
    """The export's columns (one entry per step) and its source."""
    from gaca_agent.advantages import compute
    from gaca_agent.analysis.audit import read_records
    from gaca_agent.analysis.rescore import DEFAULTS, batch_of

    files, source = source_files(path, iteration)
    by_iteration: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for n, (it, file) in enumerate(files):
        for record in read_records(file):
            if record.get("failed"):
                continue
            scope = f"it{it}" if it >= 0 else f"f{n}"  # an iteration's groups span ranks
            for step in record["trajectory"]:
                by_iteration[it].append({
                    **step, "iteration": it, "task_id": record["task_id"],
                    "task": record.get("task", ""),
                    "group": f"{scope}/g{record.get('group', record['index'])}",
                    "traj": f"{scope}/{'' if it >= 0 else n}t"
                            f"{record.get('traj', record['index'])}"})
    columns: dict[str, list] = defaultdict(list)
    for it in sorted(by_iteration):
        rows = by_iteration[it]
        scored = {name: compute(name, batch_of(rows, "state"), details=True,
                                **DEFAULTS.get(name, {})) for name in estimators}
        for i, r in enumerate(rows):
            for key in ("iteration", "group", "traj", "task_id", "t", "task", "observation",
                        "response", "action", "state_key", "next_state_key"):
                columns[key].append(r[key])
            for key in ("reward", "env_reward", "penalty", "nll"):
                columns[key].append(float(r.get(key, 0.0)))
            columns["entropy"].append(float("nan") if r.get("entropy") is None
                                      else float(r["entropy"]))
            for key in ("terminated", "truncated", "action_valid", "format_valid"):
                columns[key].append(bool(r.get(key, False)))
            for key in ("advantage", "weight"):
                columns[key].append(float(r.get(key, float("nan"))))
            for key in ("prompt_ids", "response_ids", "logprobs"):
                columns[key].append(list(r.get(key, [])))
            for name, (adv, _diag, extra) in scored.items():
                columns[f"advantage_{name}"].append(float(adv[i]))
                columns[f"weight_{name}"].append(float(extra["weight"][i]))
    if not columns:
        raise ValueError(f"{path} holds no steps of episodes that did not fail")
    return dict(columns), source


def export(path: Path, to: Path, estimators: Iterable[str] = (),
           iteration: int | None = None) -> int:
    """Write ``path``'s episodes to the folder ``to``; returns the number of rows."""
    import datasets

    columns, source = step_table(path, list(estimators), iteration)
    features = datasets.Features({
        k: (datasets.Sequence(datasets.Value("int64" if k != "logprobs" else "float64"))
            if k in ("prompt_ids", "response_ids", "logprobs") else infer(v))
        for k, v in columns.items()})
    data = datasets.Dataset.from_dict(columns, features=features)
    to = Path(to)
    data.save_to_disk(str(to))
    data.to_parquet(str(to / "steps.parquet"))
    (to / META).write_text(json.dumps({**source, "from": str(path),
                                       "estimators": list(estimators)}, indent=2))
    return len(data)


def infer(values: list):
    import datasets

    first = values[0]
    if isinstance(first, bool):
        return datasets.Value("bool")
    if isinstance(first, int):
        return datasets.Value("int64")
    if isinstance(first, float):
        return datasets.Value("float64")
    return datasets.Value("string")
