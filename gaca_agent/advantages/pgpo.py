"""PGPO (arXiv 2609.02236; details reconstructed): potential-based step shaping.

Phi(s) is the mean return-to-go of the anchor group of s. The transition signal
delta_t = gamma_p Phi(s') - Phi(s) (the final reward replaces Phi(s') on a terminal step)
is standardised within the anchor group, then scaled by how hard the task group was:
A_t = A^S_t + beta (1 - p_succ(g))^alpha A^phi_t. PGPO drops the episode term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import diagnostics, step_advantage
from gaca_agent.advantages.gigpo import StepConfig
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import (factorize, normalize_in_segments, segment_mean,
                                         shift_next)


@dataclass(frozen=True)
class PGPOConfig(StepConfig):
    """PGPO's options (reconstruction; ``omega`` and ``episode_stats`` are unused)."""

    gamma_p: float = 1.0
    alpha: float = 2.0
    beta: float = 1.0
    success_threshold: float = 0.0
    """A trajectory succeeded when its return exceeds this."""


def potentials(p: Prepared, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Phi(state), Phi(next_state)) per row. A next state never seen as a state in its
    task group takes the trajectory's own next return-to-go (0 after the last step)."""
    next_state = p.field("next_state", "pgpo")
    codes = factorize(np.concatenate([np.asarray(p.state), next_state]))
    width = int(codes.max()) + 1
    key_state = p.group * width + codes[: p.n]
    key_next = p.group * width + codes[p.n:]
    keys, anchor = np.unique(key_state, return_inverse=True)
    phi = segment_mean(G, anchor)
    pos = np.clip(np.searchsorted(keys, key_next), 0, len(keys) - 1)
    own_next = shift_next(G, p.traj, p.t, fill=0.0)
    return phi[anchor], np.where(keys[pos] == key_next, phi[pos], own_next)


@register("pgpo", PGPOConfig)
def pgpo(p: Prepared, cfg: PGPOConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    a_s, G = step_advantage(p, p.anchor, cfg.gamma, cfg.norm)
    phi, phi_next = potentials(p, G)
    terminal = (p.field("terminal", "pgpo").astype(bool) if p.batch.terminal is not None
                else np.zeros(p.n, bool))
    target = np.where(terminal, p.reward, phi_next)
    delta = cfg.gamma_p * target - phi
    a_phi = normalize_in_segments(delta, p.anchor, cfg.norm)
    success = (p.episode_return > cfg.success_threshold).astype(np.float64)
    p_succ = segment_mean(success, p.traj_group)[p.group]
    weight = cfg.beta * (1.0 - p_succ) ** cfg.alpha
    return a_s + weight * a_phi, diagnostics(p, p.anchor, weight, a_s)
