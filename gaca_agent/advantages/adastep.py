"""AdaStep (arXiv 2610.03223): a per-state, MSE-optimal shrinkage of the step advantage.

w_hat(s) = 1 - sum_a p_hat(a|s) Var_hat(G|s,a) / Var_hat(G|s), i.e. the share of the
return variance at s that the action explains (law of total variance, so in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics
from gaca_agent.advantages.gigpo import StepConfig, two_level
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import factorize, pair_ids, segment_count, segment_std


@dataclass(frozen=True)
class AdaStepConfig(StepConfig):
    """AdaStep: A = A^E + omega * w_hat(s) * A^S (omega = 1 in the paper)."""


def shrinkage(G: np.ndarray, anchor: np.ndarray, action: np.ndarray) -> np.ndarray:
    """w_hat per row. 1 unless the anchor group has >= 2 distinct actions, each sampled
    >= 2 times, and Var(G|s) > 0."""
    k = int(anchor.max()) + 1
    sa = pair_ids(anchor, factorize(action))
    sa_count = segment_count(sa)
    sa_anchor = np.zeros(len(sa_count), dtype=np.int64)
    sa_anchor[sa] = anchor
    n_actions = np.bincount(sa_anchor, minlength=k)
    min_count = np.full(k, np.inf)
    np.minimum.at(min_count, sa_anchor, sa_count)
    var_total = segment_std(G, anchor, ddof=0, k=k) ** 2
    sa_mean = np.bincount(sa, weights=G) / sa_count
    within = np.bincount(anchor, weights=(G - sa_mean[sa]) ** 2, minlength=k) / segment_count(anchor, k)
    ok = (n_actions >= 2) & (min_count >= 2) & (var_total > 0)
    w = np.ones(k)
    w[ok] = np.clip(1.0 - within[ok] / var_total[ok], 0.0, 1.0)
    return w[anchor]


@register("adastep", AdaStepConfig)
def adastep(p: Prepared, cfg: AdaStepConfig):
    a_e, a_s, anchor = two_level(p, cfg)
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    action = p.field("action", "adastep")
    weight = cfg.omega * shrinkage(p.returns_to_go(cfg.gamma), anchor, action)
    return a_e + weight * a_s, diagnostics(p, anchor, weight, a_s)
