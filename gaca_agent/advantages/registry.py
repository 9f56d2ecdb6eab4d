"""The estimator registry: one signature for every estimator.

An estimator is ``fn(prepared_batch, config) -> (advantages, diagnostics)`` registered
with its frozen config dataclass. :func:`compute` builds the config from keyword
arguments, so an unknown parameter is an error that lists the valid ones, and a bad value
is rejected by the config's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from gaca_agent.advantages.batch import Prepared, StepBatch, prepare

Estimator = Callable[[Prepared, Any], tuple[np.ndarray, dict[str, float]]]


@dataclass(frozen=True)
class Registered:
    name: str
    fn: Estimator
    config: type


_REGISTRY: dict[str, Registered] = {}
#: Parameter spellings of docs/algorithms.md that are not Python identifiers.
_ALIASES = {"lambda": "lam"}


def register(name: str, config: type) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn`` under ``name`` (a duplicate name is refused)."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config of {name!r} must be a dataclass")

    def deco(fn: Estimator) -> Estimator:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is already registered")
        _REGISTRY[name] = Registered(name, fn, config)
        return fn

    return deco


def names() -> list[str]:
    """The registered estimator names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Registered:
    """The registered estimator ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; valid: {names()}") from None


def make_config(name: str, **params: Any):
    """The config of estimator ``name`` from keyword parameters (validated)."""
    entry = get(name)
    params = {_ALIASES.get(k, k): v for k, v in params.items()}
    valid = [f.name for f in dataclasses.fields(entry.config)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown} for estimator {name!r}; "
                        f"valid: {valid}")
    return entry.config(**params)


def compute(name: str, batch: StepBatch | Prepared, details: bool = False, **params: Any):
    """Advantages (one float per step row, in the rows' order) and diagnostics.

    With ``details=True`` a third value maps ``weight`` and ``step_adv`` to per-row arrays
    (the step-level weight w_t and A^S_t; zeros for episode-level estimators).
    """
    config = make_config(name, **params)
    prepared = batch if isinstance(batch, Prepared) else prepare(batch)
    adv, raw = get(name).fn(prepared, config)
    diag = {k: float(v) for k, v in raw.items() if not k.startswith("row/")}
    adv = np.asarray(adv, dtype=np.float64)
    if not details:
        return adv, diag
    rows = {k[4:]: np.broadcast_to(np.asarray(v, dtype=np.float64), adv.shape).copy()
            for k, v in raw.items() if k.startswith("row/")}
    rows.setdefault("weight", np.zeros_like(adv))
    rows.setdefault("step_adv", np.zeros_like(adv))
    return adv, diag, rows
