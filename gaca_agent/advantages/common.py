"""Building blocks shared by estimators: episode advantage, anchor groups, step advantage,
and the diagnostics every call returns (docs/algorithms.md, GRPO and GiGPO sections)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.stats import (Norm, factorize, normalize_in_segments, pair_ids,
                                         safe_corr, segment_count)

EpisodeStats = Literal["trajectories", "steps"]


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


@dataclass(frozen=True)
class EpisodeConfig:
    """Options of the episode-level (GRPO) advantage."""

    norm: Norm = "std"
    """``std``: (R - mean) / (std + eps); ``mean``: R - mean (GiGPO's mean_norm)."""
    episode_stats: EpisodeStats = "trajectories"
    """``trajectories``: statistics over the group's trajectories (paper formula);
    ``steps``: over the group's step rows (verl-agent's default)."""

    def __post_init__(self) -> None:
        check_choice("norm", self.norm, ("std", "mean"))
        check_choice("episode_stats", self.episode_stats, ("trajectories", "steps"))


def episode_advantage(p: Prepared, norm: Norm, episode_stats: EpisodeStats) -> np.ndarray:
    """A^E per row: the row's episode score (R_i, plus its row penalty if any) normalised
    within its task group, with statistics over the group's trajectories (their R_i) or
    over its step rows (their scores, verl-agent's default), shape (n,)."""
    if p.n == 0:
        return np.zeros(0)
    if episode_stats == "trajectories":
        return normalize_in_segments(p.row_scores(), p.group, norm,
                                     member_seg=p.traj_group, member_x=p.episode_return)
    return normalize_in_segments(p.row_scores(), p.group, norm)


def similarity_anchor(p: Prepared, threshold: float) -> np.ndarray:
    """Anchor ids that merge a group's states whose observation texts are similar.

    Greedy: each distinct text joins the first cluster of its task group whose first text
    has ``difflib`` ratio >= ``threshold``, else starts one. A loop over distinct texts
    (not rows); off by default.
    """
    observations = p.batch.observation
    if observations is None:
        raise ValueError("similarity grouping needs the step rows' `observation` texts")
    text_id = factorize(np.asarray(observations, dtype=object).astype(str))
    texts = np.asarray(observations, dtype=object)
    cluster = np.empty(p.n, dtype=np.int64)
    pair = pair_ids(p.group, text_id)
    first_row = np.unique(pair, return_index=True)[1]
    reps: dict[int, list[tuple[str, int]]] = {}
    pair_cluster = np.empty(len(first_row), dtype=np.int64)
    next_id = 0
    for pid, row in enumerate(first_row):
        g, text = int(p.group[row]), str(texts[row])
        for rep_text, cid in reps.setdefault(g, []):
            if difflib.SequenceMatcher(None, rep_text, text).ratio() >= threshold:
                pair_cluster[pid] = cid
                break
        else:
            reps[g].append((text, next_id))
            pair_cluster[pid] = next_id
            next_id += 1
    cluster[:] = pair_cluster[pair]
    return cluster


def anchor_ids(p: Prepared, similarity: float | None) -> np.ndarray:
    """Exact (group, state) anchors, or similarity clusters when a threshold is given."""
    return p.anchor if similarity is None else similarity_anchor(p, similarity)


def step_advantage(p: Prepared, anchor: np.ndarray, gamma: float, norm: Norm
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A^S per row (return-to-go, plus the row penalty, normalised in its anchor group;
    singletons 0), and G."""
    G = p.returns_to_go(gamma)
    return normalize_in_segments(G, anchor, norm), G


def diagnostics(p: Prepared, anchor: np.ndarray | None = None,
                weight: np.ndarray | None = None,
                step_adv: np.ndarray | None = None) -> dict[str, float]:
    """The diagnostics of docs/algorithms.md, logged under ``adv/``.

    ``singleton_frac``: rows in anchor groups of one; ``anchor_group_size``: mean size of
    the anchor groups; ``weight_mean``/``weight_std``: the step-level weight w_t;
    ``weight_step_corr``: correlation of w_t with |A^S_t|; ``zero_variance_groups``:
    fraction of task groups whose trajectories all have the same return. The per-row
    arrays ``row/weight`` and ``row/step_adv`` ride along for reports (``compute(...,
    details=True)`` returns them; plain ``compute`` keeps only the floats).
    """
    if p.n == 0:
        return dict.fromkeys(("singleton_frac", "anchor_group_size", "weight_mean",
                              "weight_std", "weight_step_corr", "zero_variance_groups"), 0.0)
    anchor = p.anchor if anchor is None else anchor
    size = segment_count(anchor)
    weight = np.zeros(p.n) if weight is None else np.broadcast_to(weight, (p.n,))
    step_adv = np.zeros(p.n) if step_adv is None else step_adv
    return {
        "row/weight": np.asarray(weight, dtype=np.float64),
        "row/step_adv": np.asarray(step_adv, dtype=np.float64),
        "singleton_frac": float(np.mean(size[anchor] == 1)),
        "anchor_group_size": float(size.mean()),
        "weight_mean": float(weight.mean()),
        "weight_std": float(weight.std()),
        "weight_step_corr": safe_corr(weight, np.abs(step_adv)),
        "zero_variance_groups": float(np.mean(~p.group_spread())),
    }
