"""One env step on the wire: JSON-safe payloads and back (pure functions).

A served observation carries the text, the step's reward and end flags, every ``info`` key
of the local env (``info``) and, for readers that want them without digging, the contract
keys at the top level (``admissible_actions``, ``state_key``, ``task``, ``task_id``,
``won``, ``action_valid``, ``score``). :func:`decode_step` rebuilds exactly what the local
env returned: the same text, reward, flags and ``info`` (``admissible_actions`` a tuple
again).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: ``info`` keys whose local value is a tuple (JSON has only lists).
TUPLE_KEYS = ("admissible_actions",)


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays and tuples made JSON types (recursively);
    a non-finite float is refused (JSON has none)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a non-finite float ({value}) cannot be sent as JSON")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot send a {type(value).__name__} over the wire: {value!r}")


def encode_step(obs: str, reward: float | None, terminated: bool, truncated: bool,
                info: dict[str, Any]) -> dict[str, Any]:
    """The observation fields of one reset (reward ``None``) or step."""
    info = jsonable(info)
    return {
        "text": obs,
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "admissible_actions": info.get("admissible_actions", []),
        "state_key": info.get("state_key", ""),
        "task": info.get("task", ""),
        "task_id": info.get("task_id"),
        "won": bool(info.get("won", False)),
        "action_valid": bool(info.get("action_valid", True)),
        "score": info.get("score"),
        "info": info,
        "reward": None if reward is None else float(reward),
        "done": bool(terminated or truncated),
    }


def decode_step(payload: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """``(obs, reward, terminated, truncated, info)`` from an OpenEnv observation message's
    ``data`` (``{"observation": {...}, "reward": r, "done": d}``)."""
    fields = payload.get("observation", payload)
    info = dict(fields.get("info") or {})
    for key in TUPLE_KEYS:
        if key in info:
            info[key] = tuple(info[key])
    reward = payload.get("reward", fields.get("reward"))
    return (fields["text"], 0.0 if reward is None else float(reward),
            bool(fields.get("terminated", False)), bool(fields.get("truncated", False)), info)
