"""GACA (arXiv 2609.12424): GiGPO's two advantages blended by an NLL-modulated weight.

z_t standardises the step's NLL within a scope, over the steps whose anchor group has at
least two members; the step weight w_t grows with z_t (``linear``, ``sigmoid``), or a
convex mixing coefficient lambda_t does (``convex``). docs/algorithms.md, GACA section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import check_choice, diagnostics
from gaca_agent.advantages.gigpo import StepConfig, two_level
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import EPS, segment_count, segment_mean, segment_std

Form = Literal["linear", "sigmoid", "convex"]
Scope = Literal["trajectory", "group", "batch"]


@dataclass(frozen=True)
class GACAConfig(StepConfig):
    """GACA's options (the weight forms are a reconstruction; ``linear`` is default)."""

    kappa: float = 0.25
    """Modulation strength; 0 recovers GiGPO exactly."""
    form: Form = "linear"
    """``linear``: w = omega * clip(1 + kappa z, w_min, w_max); ``sigmoid``:
    w = omega * 2 sigmoid(kappa z); ``convex``: A = (1 - lam) A^E + lam A^S with
    lam = clip(lambda_bar + kappa z, 0, 1)."""
    scope: Scope = "trajectory"
    """Rows over which the NLL is standardised."""
    w_min: float = 0.0
    w_max: float = 2.0
    lambda_bar: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("form", self.form, ("linear", "sigmoid", "convex"))
        check_choice("scope", self.scope, ("trajectory", "group", "batch"))
        if self.kappa < 0:
            raise ValueError(f"kappa must be >= 0 (weights grow with NLL), got {self.kappa}")
        if not self.w_min <= 1.0 <= self.w_max:
            raise ValueError("need w_min <= 1 <= w_max so that kappa = 0 is GiGPO")
        if not 0.0 <= self.lambda_bar <= 1.0:
            raise ValueError(f"lambda_bar must be in [0, 1], got {self.lambda_bar}")


def criticality(nll: np.ndarray, scope: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """z_t = (nll_t - mu) / (sigma + eps) with mu, sigma (population) over the eligible
    rows of each scope; 0 where sigma = 0, where the scope has < 2 eligible rows, and on
    ineligible rows. Shape (n,)."""
    k = int(scope.max()) + 1
    rows = np.flatnonzero(eligible)
    count = segment_count(scope[rows], k)
    mu = segment_mean(nll[rows], scope[rows], k)
    sigma = segment_std(nll[rows], scope[rows], ddof=0, k=k)
    # sigma = 0 tested exactly (min == max): rounding in sigma must not make z non-zero.
    lo, hi = np.full(k, np.inf), np.full(k, -np.inf)
    np.minimum.at(lo, scope[rows], nll[rows])
    np.maximum.at(hi, scope[rows], nll[rows])
    ok = (count >= 2) & (hi > lo)
    z = (nll - mu[scope]) / (sigma[scope] + EPS)
    return np.where(ok[scope] & eligible, z, 0.0)


@register("gaca", GACAConfig)
def gaca(p: Prepared, cfg: GACAConfig):
    a_e, a_s, anchor = two_level(p, cfg)
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    nll = p.field("nll", "gaca").astype(np.float64)
    if not np.all(np.isfinite(nll)):
        raise ValueError("`nll` has non-finite values")
    eligible = segment_count(anchor)[anchor] >= 2
    scope = {"trajectory": p.traj, "group": p.group, "batch": np.zeros(p.n, np.int64)}
    z = criticality(nll, scope[cfg.scope], eligible)
    if cfg.form == "convex":
        lam = np.where(eligible, np.clip(cfg.lambda_bar + cfg.kappa * z, 0.0, 1.0), 0.0)
        return (1.0 - lam) * a_e + lam * a_s, diagnostics(p, anchor, lam, a_s)
    if cfg.form == "linear":
        weight = cfg.omega * np.clip(1.0 + cfg.kappa * z, cfg.w_min, cfg.w_max)
    else:
        weight = cfg.omega * 2.0 / (1.0 + np.exp(-cfg.kappa * z))
    return a_e + weight * a_s, diagnostics(p, anchor, weight, a_s)
