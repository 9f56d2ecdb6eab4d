"""Credit-assignment estimators: one pure function per estimator, one signature for all.

>>> from gaca_agent.advantages import StepBatch, compute, names
>>> adv, diag = compute("gaca", batch, gamma=0.95, kappa=0.25)

Definitions: docs/algorithms.md. Every estimator maps a :class:`StepBatch` (rows in any order)
to one advantage per row plus the diagnostics of :func:`common.diagnostics`.
"""

from gaca_agent.advantages import (adastep, ecpo, empg, episode, gaca, gigpo, graft,  # noqa: F401
                                   pgpo, shrink, spread)
from gaca_agent.advantages.batch import Prepared, StepBatch, prepare
from gaca_agent.advantages.registry import compute, get, make_config, names, register

__all__ = ["Prepared", "StepBatch", "compute", "get", "make_config", "names", "prepare",
           "register"]
