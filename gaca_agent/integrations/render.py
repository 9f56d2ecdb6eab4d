"""The text an integration shows a model: the task, the observation, the actions."""

from __future__ import annotations

from typing import Any


def render(observation: str, info: dict[str, Any], *, task: bool = False) -> str:
    """The text the model reads: the task (at reset), the observation and the actions."""
    parts = [f"Task: {info['task']}"] if task and info.get("task") else []
    parts.append(observation)
    if info.get("admissible_actions"):
        parts.append("Admissible actions: " + "; ".join(info["admissible_actions"]))
    return "\n".join(parts)
