"""What the reliability benchmarks share: a process's RSS (and a process tree's RSS and
PSS), its slope, the ALFWorld env kwargs, and the report (printed, and written as JSON)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def memory_mb(pids: list[int]) -> tuple[float, float]:
    """(sum of RSS, sum of PSS) of ``pids`` in MB; processes gone meanwhile count 0."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    n = len(samples)
    if n < 2:
        return float("nan")
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (r - mr) for t, r in samples) / var if var else float("nan")


def alfworld_kwargs() -> dict[str, str]:
    """valid_seen from ``$GACA_DATA`` (or the data's other known places); exits if absent."""
    from gaca_envs.data import data_path

    data = data_path("alfworld")
    if data is None:
        raise SystemExit("ALFWorld data not found: set GACA_DATA")
    return {"split": "valid_seen", "data_dir": str(data)}


def write_report(report: dict[str, Any], path: Path | None) -> None:
    """Print ``report`` (without its RSS samples) and write all of it to ``path``."""
    print(json.dumps({k: v for k, v in report.items() if k != "rss_samples"}, indent=1))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
