"""Per-anchor action statistics of the returns-to-go: how many times each canonical
action was taken at an anchor state, its mean return, and the anchor's between- and
within-action sums of squares (one-way analysis of variance, vectorised)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.stats import (EPS, Norm, factorize, pair_ids, segment_count,
                                         segment_mean, segment_std)


@dataclass(frozen=True)
class ActionStats:
    """Per row: its anchor's and its (anchor, action)'s statistics, shape (n,) each."""

    n_anchor: np.ndarray
    """Rows in the row's anchor group."""
    n_action: np.ndarray
    """Rows of the row's anchor group that took its action (n_a)."""
    k_actions: np.ndarray
    """Distinct actions taken in the row's anchor group."""
    anchor_mean: np.ndarray
    action_mean: np.ndarray
    between: np.ndarray
    """The anchor's sum over actions of n_a (mean_a - mean_s)^2."""
    within: np.ndarray
    """The anchor's sum over rows of (G - mean_a)^2."""
    scale: np.ndarray
    """What a step advantage is divided by: the anchor's sample std + EPS (``std``), 1
    (``mean``)."""

    def between_share(self) -> np.ndarray:
        """B / (B + W): the share of the anchor's return variation that lies between its
        actions (0 where every return is equal)."""
        total = self.between + self.within
        return np.divide(self.between, total, out=np.zeros(len(total)), where=total > 0)


def action_stats(G: np.ndarray, anchor: np.ndarray, action: np.ndarray,
                 norm: Norm) -> ActionStats:
    k = int(anchor.max()) + 1
    sa = pair_ids(anchor, factorize(action))
    n_sa = segment_count(sa)
    sa_anchor = np.zeros(len(n_sa), dtype=np.int64)
    sa_anchor[sa] = anchor
    mean_s = segment_mean(G, anchor, k)
    mean_sa = segment_mean(G, sa, len(n_sa))
    between = np.bincount(sa_anchor, weights=n_sa * (mean_sa - mean_s[sa_anchor]) ** 2,
                          minlength=k)
    within = np.bincount(anchor, weights=(G - mean_sa[sa]) ** 2, minlength=k)
    scale = (segment_std(G, anchor, 1, k) + EPS if norm == "std" else np.ones(k))
    return ActionStats(segment_count(anchor, k)[anchor], n_sa[sa],
                       np.bincount(sa_anchor, minlength=k).astype(np.float64)[anchor],
                       mean_s[anchor], mean_sa[sa], between[anchor], within[anchor],
                       scale[anchor])


def action_level(p, cfg, name: str, norm: Norm | None = None):
    """(A^E, anchor ids, the anchors' :class:`ActionStats`) of a step-level estimator's
    config (``norm``: the statistics' scale, the config's by default)."""
    from gaca_agent.advantages.common import anchor_ids, episode_advantage

    anchor = anchor_ids(p, cfg.similarity)
    return (episode_advantage(p, cfg.norm, cfg.episode_stats), anchor,
            action_stats(p.returns_to_go(cfg.gamma), anchor, p.field("action", name),
                         norm or cfg.norm))
