"""Reading a ``gaca-export`` folder back (:mod:`gaca_agent.integrations.datasets` writes
it): its rows as episode records, for ``gaca-rescore`` and ``gaca-audit``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

META = "gaca_export.json"


def is_export(path: Path) -> bool:
    """Whether ``path`` is a folder ``gaca-export`` wrote."""
    return (Path(path) / META).is_file()


def read_export(path: Path) -> Iterable[dict[str, Any]]:
    """An export's rows as episode records (the ``episodes.jsonl`` form) for the
    analysis commands: one record per trajectory, its steps in order."""
    import datasets

    data = datasets.load_from_disk(str(path))
    episodes: dict[str, dict[str, Any]] = {}
    for row in data:
        ep = episodes.setdefault(row["traj"], {
            "index": len(episodes), "group": row["group"], "traj": row["traj"],
            "task_id": row["task_id"], "task": row["task"], "iteration": row["iteration"],
            "failed": False, "trajectory": []})
        step = {k: row[k] for k in ("t", "observation", "response", "action", "reward",
                                    "env_reward", "penalty", "state_key", "next_state_key",
                                    "terminated", "truncated", "action_valid",
                                    "format_valid", "nll")}
        step["entropy"] = None if np.isnan(row["entropy"]) else row["entropy"]
        ep["trajectory"].append(step)
    for ep in episodes.values():
        ep["trajectory"].sort(key=lambda s: s["t"])
    return list(episodes.values())


def export_source(path: Path) -> dict[str, Any]:
    meta = json.loads((Path(path) / META).read_text())
    return {"env": meta.get("env"), "env_kwargs": meta.get("env_kwargs", {})}
