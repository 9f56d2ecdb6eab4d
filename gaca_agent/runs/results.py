"""Episode files and result summaries: ``episodes.jsonl`` and ``results.json``."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from gaca_agent.steps import Episode

Z95 = 1.959963984540054


def episode_record(index: int, ep: Episode, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``episodes.jsonl`` line: task_id, seed, every observation, action, reward, state
    key and step NLL (``steps``: the episode's rows as :meth:`StepTable.record` gives)."""
    return {"index": index, "group": ep.group, "traj": ep.traj, "task_id": ep.task_id,
            "seed": ep.seed, "task": ep.task, "task_type": ep.task_type, "won": ep.won,
            "score": ep.score, "reward": ep.total_reward, "steps": ep.length,
            "failed": ep.failed, "error": ep.error, "final_observation": ep.final_observation,
            "trajectory": steps}


def read_episodes(path: Path) -> dict[int, dict[str, Any]]:
    """The latest record of each episode index in an ``episodes.jsonl`` (a partial last
    line, left by a kill during a write, is ignored)."""
    records: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return records
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[int(record["index"])] = record
    return records


def drop_partial_line(path: Path) -> None:
    """Cut a last line left unfinished by a kill during a write, so appends stay valid."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def wilson(successes: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (exactly 0 below all-failures and 1
    above all-successes, where rounding would otherwise print 0.9999999999999999)."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / denom
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) with a normal 95% interval."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    m = sum(values) / n
    if n == 1:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return m, m - half, m + half


def _block(records: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in records if not r["failed"]]
    wins = sum(bool(r["won"]) for r in done)
    low, high = wilson(wins, len(done))
    score, s_low, s_high = mean_ci([float(r["score"]) for r in done])
    steps = [s for r in done for s in r["trajectory"]]
    return {
        "n": len(done), "failed": len(records) - len(done),
        "success_rate": wins / len(done) if done else 0.0, "success_ci95": [low, high],
        "mean_score": score, "score_ci95": [s_low, s_high],
        "mean_steps": sum(r["steps"] for r in done) / len(done) if done else 0.0,
        "format_invalid_rate": (sum(not s["format_valid"] for s in steps) / len(steps)
                                if steps else 0.0),
        "action_invalid_rate": (sum(not s["action_valid"] for s in steps) / len(steps)
                                if steps else 0.0),
    }


def summarize(records: Iterable[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """``results.json``: totals with 95% intervals, and the same per task type."""
    records = sorted(records, key=lambda r: r["index"])
    by_type: dict[str, list] = defaultdict(list)
    for r in records:
        by_type[r.get("task_type") or "all"].append(r)
    out = {**meta, **_block(records)}
    if len(by_type) > 1 or "all" not in by_type:
        out["per_task_type"] = {t: _block(rs) for t, rs in sorted(by_type.items())}
    return out
