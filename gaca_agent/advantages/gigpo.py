"""GiGPO (Feng et al., 2025, arXiv 2505.10978): episode plus anchor-state step advantage.

A_t = A^E_i + omega * A^S_t, where A^S_t normalises the discounted return-to-go G_t
within the anchor group of rows of the same task group and the same state (Eq. 6-8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import (EpisodeConfig, anchor_ids, check_gamma, diagnostics,
                                          episode_advantage, step_advantage)
from gaca_agent.advantages.registry import register


@dataclass(frozen=True)
class StepConfig(EpisodeConfig):
    """Options shared by the estimators with an anchor-state step advantage."""

    gamma: float = 0.95
    """Discount of the step-level return-to-go G_t (GiGPO: 0.95)."""
    omega: float = 1.0
    """Weight of the step-level advantage (GiGPO: 1.0)."""
    similarity: float | None = None
    """If set, states whose observation texts have difflib ratio >= this threshold share
    an anchor group (GiGPO's similarity grouping); needs ``observation`` in the batch."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gamma(self.gamma)
        if self.similarity is not None and not 0.0 < self.similarity <= 1.0:
            raise ValueError(f"similarity must be in (0, 1] or None, got {self.similarity}")


@dataclass(frozen=True)
class GiGPOConfig(StepConfig):
    """GiGPO with a fixed step weight ``omega``."""


def two_level(p: Prepared, cfg: StepConfig):
    """(A^E, A^S, anchor ids) for a step-level estimator's config."""
    anchor = anchor_ids(p, cfg.similarity)
    a_e = episode_advantage(p, cfg.norm, cfg.episode_stats)
    a_s, _ = step_advantage(p, anchor, cfg.gamma, cfg.norm)
    return a_e, a_s, anchor


@register("gigpo", GiGPOConfig)
def gigpo(p: Prepared, cfg: GiGPOConfig):
    a_e, a_s, anchor = two_level(p, cfg)
    weight = np.full(p.n, cfg.omega)
    return a_e + cfg.omega * a_s, diagnostics(p, anchor, weight, a_s)
