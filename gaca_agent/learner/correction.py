"""The off-policy correction of the decoupled PPO objective, as pure functions over ragged
per-token log-probs (numpy; no torch).

Three policies meet in an update: the **behaviour** policy that sampled the tokens (the
inference server's, at the weight version that answered, whose log-probs the rollout
recorded), the **proximal** policy (the learner's own weights when the update starts: a
teacher-forced pass, ``old_logprobs: recompute``) and the policy being trained. The
clipped surrogate uses pi_theta / pi_proximal; each token's loss is weighted by
rho = pi_proximal / pi_behaviour (Hilton et al. 2022, decoupled PPO; AReaL's objective):

- ``cap`` (``learner.tis_cap``): the weight is min(rho, cap) (truncated IS);
- ``band`` (``learner.is_mask``): a token whose rho lies outside [low, high] gets weight 0
  (masked; IcePop's token mask);
- ``geo_band`` (``learner.is_geo_mask``): a step whose geometric mean of rho over its
  tokens, exp(mean log rho), lies outside [low, high] gets weight 0 on every token (a
  sequence-level geometric mask, verl's Geo-RS).

With none of them there is no weighting (:func:`importance_weights` returns ``None``
weights); the ratios are still measured. A token the engine gave no log-prob for has
rho = 1 and is left out of the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Correction:
    cap: float | None = None
    band: tuple[float, float] | None = None
    geo_band: tuple[float, float] | None = None

    @property
    def weighted(self) -> bool:
        return self.cap is not None or self.band is not None or self.geo_band is not None


def ratios(proximal: np.ndarray, behaviour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rho per token, whether the token has a behaviour log-prob)."""
    proximal = np.asarray(proximal, dtype=np.float64)
    behaviour = np.asarray(behaviour, dtype=np.float64)
    known = np.isfinite(behaviour)
    return np.exp(proximal - np.where(known, behaviour, proximal)), known


def geometric_means(rho: np.ndarray, known: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """exp(mean log rho) of each row's known tokens (1 for a row with none)."""
    logs = np.where(known, np.log(rho), 0.0)
    sums = np.add.reduceat(logs, offsets[:-1]) if len(logs) else np.zeros(len(offsets) - 1)
    counts = np.add.reduceat(known.astype(np.float64), offsets[:-1]) if len(logs) else \
        np.zeros(len(offsets) - 1)
    empty = np.diff(offsets) == 0  # reduceat reads the next row's first value for these
    sums, counts = np.where(empty, 0.0, sums), np.where(empty, 0.0, counts)
    return np.exp(np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0))


def importance_weights(proximal: np.ndarray, behaviour: np.ndarray, offsets: np.ndarray,
                       correction: Correction) -> tuple[np.ndarray | None, dict[str, float]]:
    """Per-token weights of the flat tokens of rows ``offsets`` (None when the correction
    weighs nothing) and the sums the learner logs: ``ratio_sum``, ``ratio_max``,
    ``ratio_n`` (known tokens), ``truncated`` and ``masked`` (known tokens)."""
    rho, known = ratios(proximal, behaviour)
    stats = {"ratio_sum": float(rho[known].sum()), "ratio_n": float(known.sum()),
             "ratio_max": float(rho[known].max()) if known.any() else 0.0,
             "truncated": 0.0, "masked": 0.0}
    if not correction.weighted:
        return None, stats
    weight = rho.copy()
    keep = np.ones(len(rho), dtype=bool)
    if correction.band is not None:
        low, high = correction.band
        keep &= (rho >= low) & (rho <= high)
    if correction.geo_band is not None:
        low, high = correction.geo_band
        geo = geometric_means(rho, known, np.asarray(offsets))
        per_token = np.repeat(geo, np.diff(offsets))
        keep &= (per_token >= low) & (per_token <= high)
    if correction.cap is not None:
        stats["truncated"] = float((known & keep & (rho > correction.cap)).sum())
        weight = np.minimum(weight, correction.cap)
    stats["masked"] = float((known & ~keep).sum())
    return np.where(keep, weight, 0.0), stats
