"""Episode-level estimators: GRPO, RLOO and REINFORCE++ (baseline variant).

Every step of trajectory i gets the same advantage A_i (docs/algorithms.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import EpisodeConfig, diagnostics, episode_advantage
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import EPS, segment_count


@dataclass(frozen=True)
class GRPOConfig(EpisodeConfig):
    """GRPO (Shao et al., 2024): A_i = (R_i - mean_g R) / (std_g R + eps)."""


@register("grpo", GRPOConfig)
def grpo(p: Prepared, cfg: GRPOConfig):
    return episode_advantage(p, cfg.norm, cfg.episode_stats), diagnostics(p)


@dataclass(frozen=True)
class RLOOConfig:
    """RLOO (Ahmadian et al., 2024): A_i = R_i - mean of the group's other returns."""


@register("rloo", RLOOConfig)
def rloo(p: Prepared, cfg: RLOOConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    R, g = p.episode_return, p.traj_group
    count = segment_count(g)
    total = np.bincount(g, weights=R)
    others = np.divide(total[g] - R, count[g] - 1, out=np.zeros_like(R), where=count[g] > 1)
    per_traj = np.where(count[g] > 1, R - others, 0.0)
    return per_traj[p.traj], diagnostics(p)


@dataclass(frozen=True)
class ReinforcePPConfig:
    """REINFORCE++ baseline variant (Hu, 2025): A_i = R_i - mean_g R, divided by the
    standard deviation of these centred returns over the whole batch's trajectories."""


@register("reinforce_pp", ReinforcePPConfig)
def reinforce_pp(p: Prepared, cfg: ReinforcePPConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    R, g = p.episode_return, p.traj_group
    centred = R - (np.bincount(g, weights=R) / segment_count(g))[g]
    scale = centred.std(ddof=1) if len(centred) > 1 else 0.0
    return (centred / (scale + EPS))[p.traj], diagnostics(p)
