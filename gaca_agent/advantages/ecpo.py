"""ECPO (Li et al., 2026, arXiv 2606.05885): evidence-calibrated action advantage and
variance-gated credit weighting (docs/algorithms.md, "ECPO").

``ecpo``, the paper's form as its equations are quoted in summaries of the paper (the
full text was not readable here): within an anchor group s of n_s rows, each canonical
action's mean return is shrunk toward the anchor's mean by a pseudo-count kappa,
mu~_a = (n_a mean_a + kappa mean_s) / (n_a + kappa), so the action advantage is
A_act = mu~_a - mean_s = n_a / (n_a + kappa) (mean_a - mean_s), in return units; the gate
is rho_s = tanh(n_s / tau) B_s / (B_s + W_s + eps); A = A^E + omega rho_s A_act.

``ecpo_scaled``, the form this project built from the abstract before the equations
were found (its studies' ``ecpo``): A_act divided by the anchor's return spread, and the
gate without the tanh(n_s / tau) factor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.actions import action_level
from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics
from gaca_agent.advantages.gigpo import StepConfig
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import EPS


@dataclass(frozen=True)
class ECPOScaledConfig(StepConfig):
    kappa: float = 2.0
    """Evidence pseudo-count: an action taken n_a times keeps n_a / (n_a + kappa) of its
    deviation from the anchor's mean (0: no shrinkage)."""
    gate: bool = True
    """Variance-gated credit weighting (off: every anchor's step term at full weight)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kappa < 0:
            raise ValueError(f"kappa must be >= 0, got {self.kappa}")


@dataclass(frozen=True)
class ECPOConfig(ECPOScaledConfig):
    tau: float = 4.0
    """Evidence scale of the gate's tanh(n_s / tau): an anchor seen n_s times keeps
    tanh(n_s / tau) of its credit (our default, about a group's size: the paper's value
    was not found)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


def _calibrated(s, kappa: float) -> np.ndarray:
    """n_a / (n_a + kappa) (mean_a - mean_s) per row; 0 in an anchor group of one row."""
    return np.where(s.n_anchor >= 2, s.n_action / (s.n_action + kappa)
                    * (s.action_mean - s.anchor_mean), 0.0)


@register("ecpo", ECPOConfig)
def ecpo(p: Prepared, cfg: ECPOConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_e, anchor, s = action_level(p, cfg, "ecpo", norm="mean")
    step = _calibrated(s, cfg.kappa)
    rho = np.tanh(s.n_anchor / cfg.tau) * s.between / (s.between + s.within + EPS) \
        if cfg.gate else np.ones(p.n)
    weight = cfg.omega * rho
    return a_e + weight * step, diagnostics(p, anchor, weight, step)


@register("ecpo_scaled", ECPOScaledConfig)
def ecpo_scaled(p: Prepared, cfg: ECPOScaledConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_e, anchor, s = action_level(p, cfg, "ecpo_scaled")
    step = _calibrated(s, cfg.kappa) / s.scale
    weight = cfg.omega * (s.between_share() if cfg.gate else np.ones(p.n))
    return a_e + weight * step, diagnostics(p, anchor, weight, step)
