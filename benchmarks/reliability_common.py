"""What the reliability benchmarks share: a process's RSS, its slope, the ALFWorld env
kwargs, and the report (printed, and written as JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
