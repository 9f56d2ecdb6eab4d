"""The variance-aware mixture (ours, docs/algorithms.md "shrink"): no NLL; each action's
step-level estimate at an anchor is shrunk toward the episode-level advantage by the
anchor's own measured noise, in the empirical-Bayes (James-Stein) form of a one-way
random-effects model:

    sigma2_s = W_s / (n_s - k_s)                       (within-action noise)
    tau2_s   = max(0, (B_s / (k_s - 1) - sigma2_s) / n0_s)   (spread of the action effects)
    lambda   = tau2_s / (tau2_s + sigma2_s / n_a)
    A = A^E + omega * lambda * (mean_a - mean_s) / scale_s
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.actions import ActionStats, action_level
from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics
from gaca_agent.advantages.gigpo import StepConfig
from gaca_agent.advantages.registry import register


@dataclass(frozen=True)
class ShrinkConfig(StepConfig):
    """The James-Stein mixture of the episode- and step-level advantages."""


def eb_factor(s: ActionStats, anchor: np.ndarray) -> np.ndarray:
    """lambda per row. An anchor without repeated actions takes the noise pooled over the
    batch's anchors that have them; with none anywhere, lambda is 0 (no measured noise,
    no step-level credit)."""
    dof = s.n_anchor - s.k_actions
    per_anchor = 1.0 / s.n_anchor  # sums over an anchor's rows count each anchor once
    pooled_dof = float(np.sum(dof * per_anchor))
    pooled = float(np.sum(s.within * per_anchor)) / pooled_dof if pooled_dof > 0 else None
    if pooled is None:
        return np.zeros(len(anchor))
    sigma2 = np.divide(s.within, dof, out=np.full(len(anchor), pooled), where=dof > 0)
    several = s.k_actions >= 2
    sum_na2 = np.bincount(anchor, weights=s.n_action)[anchor]  # sum over actions of n_a^2
    n0 = np.divide(s.n_anchor - sum_na2 / s.n_anchor, s.k_actions - 1,
                   out=np.ones(len(anchor)), where=several)
    ms_between = np.divide(s.between, s.k_actions - 1, out=np.zeros(len(anchor)),
                           where=several)
    tau2 = np.where(several, np.maximum(0.0, (ms_between - sigma2) / n0), 0.0)
    noise = sigma2 / s.n_action
    return np.divide(tau2, tau2 + noise, out=np.zeros(len(anchor)), where=tau2 > 0)


@register("shrink", ShrinkConfig)
def shrink(p: Prepared, cfg: ShrinkConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_e, anchor, s = action_level(p, cfg, "shrink")
    step = np.where(s.n_anchor >= 2, (s.action_mean - s.anchor_mean) / s.scale, 0.0)
    weight = cfg.omega * eb_factor(s, anchor)
    return a_e + weight * step, diagnostics(p, anchor, weight, step)
