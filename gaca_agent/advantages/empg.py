"""EMPG (arXiv 2509.09265): entropy-modulated policy gradients.

Confident (low-entropy) steps get their episode advantage amplified and uncertain steps
damped, plus a bonus for leading to a confident next step:
A_t = g_t A_i + zeta f_{t+1}, then the batch mean is subtracted, with
g_t = exp(-k H_t) / mean(exp(-k H)), f_t = exp(-k' H_t), H min-max normalised over the
batch. The opposite direction to GACA, hence a useful baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import EpisodeConfig, diagnostics, episode_advantage
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import shift_next


@dataclass(frozen=True)
class EMPGConfig(EpisodeConfig):
    """EMPG's options; A_i is the GRPO episode advantage (``norm``, ``episode_stats``)."""

    k: float = 1.0
    k_prime: float = 1.0
    zeta: float = 0.1


@register("empg", EMPGConfig)
def empg(p: Prepared, cfg: EMPGConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    H = (p.field("entropy", "empg") if p.batch.entropy is not None
         else p.field("nll", "empg (without entropy)")).astype(np.float64)
    span = H.max() - H.min()
    h = (H - H.min()) / span if span > 0 else np.zeros(p.n)
    g = np.exp(-cfg.k * h)
    g = g / g.mean()
    f_next = shift_next(np.exp(-cfg.k_prime * h), p.traj, p.t, fill=0.0)
    adv = g * episode_advantage(p, cfg.norm, cfg.episode_stats) + cfg.zeta * f_next
    return adv - adv.mean(), diagnostics(p, weight=g)
