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
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from gaca_agent.runs.exported import META


def step_table(path: Path, estimators: Iterable[str] = (), iteration: int | None = None
               ) -> tuple[dict[str, list], dict]:
    """The export's columns (one entry per step) and its source: each iteration's steps
    as ``gaca-rescore`` reads and scores them."""
    from gaca_agent.advantages import compute
    from gaca_agent.analysis.rescore import (DEFAULTS, batch_of, rollout_files, source_files,
                                             step_rows)

    if iteration is None:
        found, source = source_files(path)
    else:
        chosen, source = rollout_files(Path(path), iteration)
        found = [(source.get("iteration", -1), f) for f in chosen]
    by_iteration: dict[int, list[Path]] = defaultdict(list)
    for it, file in found:
        by_iteration[it].append(file)
    columns: dict[str, list] = defaultdict(list)
    for it in sorted(by_iteration):
        rows = [{**row, "iteration": it, "group": label(it, row["group"]),
                 "traj": label(it, row["traj"])} for row in step_rows(by_iteration[it])]
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


def label(iteration: int, key) -> str:
    """A group or trajectory id unique in the export: ``it3/7`` (iteration 3's group 7),
    ``eval/0/7`` (group 7 of an evaluation's first file)."""
    parts = key if isinstance(key, tuple) else (key,)
    return "/".join([f"it{iteration}" if iteration >= 0 else "eval", *map(str, parts)])


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
