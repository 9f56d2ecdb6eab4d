"""A criticality proxy (ours, docs/algorithms.md "spread"): GiGPO's step term weighted by
how much the action matters at the anchor, measured as the spread of the returns across
the actions taken there (not the step's NLL, which the measurements found negatively
related to it):

    d_s = sqrt(B_s / n_s)          (count-weighted std of the action means)
    w_s = omega * clip(d_s / mean over anchors with >= 2 actions of d, 0, w_max)
    A = A^E + w_s * A^S_t
An anchor where one action was taken has d_s = 0: no step-level credit there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.actions import action_level
from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics, step_advantage
from gaca_agent.advantages.gigpo import StepConfig
from gaca_agent.advantages.registry import register


@dataclass(frozen=True)
class SpreadConfig(StepConfig):
    w_max: float = 4.0
    """The largest weight relative to omega."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.w_max <= 0:
            raise ValueError(f"w_max must be > 0, got {self.w_max}")


@register("spread", SpreadConfig)
def spread(p: Prepared, cfg: SpreadConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_e, anchor, s = action_level(p, cfg, "spread", "mean")
    a_s, _ = step_advantage(p, anchor, cfg.gamma, cfg.norm)
    d = np.sqrt(s.between / s.n_anchor)
    several = s.k_actions >= 2
    anchors = float(np.sum(several / s.n_anchor))
    typical = float(np.sum(d * several / s.n_anchor)) / anchors if anchors else 0.0
    weight = (cfg.omega * np.clip(d / typical, 0.0, cfg.w_max) if typical > 0
              else np.zeros(p.n))
    return a_e + weight * a_s, diagnostics(p, anchor, weight, a_s)
