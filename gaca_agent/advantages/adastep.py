"""AdaStep (arXiv 2610.03223): a per-state, MSE-optimal shrinkage of the step advantage.

w_hat(s) = 1 - sum_a p_hat(a|s) Var_hat(G|s,a) / Var_hat(G|s), i.e. the share of the
return variance at s that the action explains (law of total variance, so in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.actions import action_stats
from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics
from gaca_agent.advantages.gigpo import StepConfig, two_level
from gaca_agent.advantages.registry import register


@dataclass(frozen=True)
class AdaStepConfig(StepConfig):
    """AdaStep: A = A^E + omega * w_hat(s) * A^S (omega = 1 in the paper)."""


def shrinkage(G: np.ndarray, anchor: np.ndarray, action: np.ndarray) -> np.ndarray:
    """w_hat per row. 1 unless the anchor group has >= 2 distinct actions, each sampled
    >= 2 times, and Var(G|s) > 0."""
    s = action_stats(G, anchor, action, "mean")
    min_count = np.full(int(anchor.max()) + 1, np.inf)
    np.minimum.at(min_count, anchor, s.n_action)
    ok = (s.k_actions >= 2) & (min_count[anchor] >= 2) & (s.between + s.within > 0)
    return np.where(ok, s.between_share(), 1.0)  # 1 - within/total: the explained share


@register("adastep", AdaStepConfig)
def adastep(p: Prepared, cfg: AdaStepConfig):
    a_e, a_s, anchor = two_level(p, cfg)
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    action = p.field("action", "adastep")
    weight = cfg.omega * shrinkage(p.returns_to_go(cfg.gamma), anchor, action)
    return a_e + weight * a_s, diagnostics(p, anchor, weight, a_s)
