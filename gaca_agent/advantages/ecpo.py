"""ECPO (Li et al., 2026, arXiv 2606.05885), as its abstract describes it; the formulas
are ours (docs/algorithms.md, "ECPO"): the paper's equations were not available.

Evidence-calibrated action advantage: within an anchor group the rows are grouped by
canonical action and each action's mean return-to-go is shrunk toward the anchor's mean
by a pseudo-count kappa, A^S_a = n_a / (n_a + kappa) * (mean_a - mean_s) / scale_s.
Variance-gated credit weighting: the anchor's step term is scaled by the share of its
return variance that lies between actions, g_s = B_s / (B_s + W_s).
A = A^E + omega * g_s * A^S_a.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.actions import action_level
from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics
from gaca_agent.advantages.gigpo import StepConfig
from gaca_agent.advantages.registry import register


@dataclass(frozen=True)
class ECPOConfig(StepConfig):
    kappa: float = 2.0
    """Evidence pseudo-count: an action taken n_a times keeps n_a / (n_a + kappa) of its
    deviation from the anchor's mean (0: no shrinkage)."""
    gate: bool = True
    """Variance-gated credit weighting (off: every anchor's step term at full weight)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kappa < 0:
            raise ValueError(f"kappa must be >= 0, got {self.kappa}")


@register("ecpo", ECPOConfig)
def ecpo(p: Prepared, cfg: ECPOConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_e, anchor, s = action_level(p, cfg, "ecpo")
    step = np.where(s.n_anchor >= 2, s.n_action / (s.n_action + cfg.kappa)
                    * (s.action_mean - s.anchor_mean) / s.scale, 0.0)
    weight = cfg.omega * (s.between_share() if cfg.gate else np.ones(p.n))
    return a_e + weight * step, diagnostics(p, anchor, weight, step)
