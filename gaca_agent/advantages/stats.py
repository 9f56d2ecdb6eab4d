"""Vectorised segment statistics (numpy, no Python loop per row).

A *segment* is a set of rows sharing a dense integer id (``0..k-1``): a task group, a
trajectory, an anchor group. Every function takes the per-row values and the per-row
segment id and returns per-segment or per-row results.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

EPS = 1e-6
Norm = Literal["std", "mean"]


def factorize(values: np.ndarray) -> np.ndarray:
    """Dense ids ``0..k-1`` for arbitrary hashable codes (ints, strings), shape (n,)."""
    values = np.asarray(values)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)


def pair_ids(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense ids of the pairs ``(a[i], b[i])`` for two dense-id arrays."""
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64)
    return factorize(a.astype(np.int64) * (int(b.max()) + 1) + b.astype(np.int64))


def segment_count(seg: np.ndarray, k: int | None = None) -> np.ndarray:
    return np.bincount(seg, minlength=k or 0).astype(np.float64)


def segment_mean(x: np.ndarray, seg: np.ndarray, k: int | None = None) -> np.ndarray:
    """Per-segment mean, shape (k,); empty segments give 0."""
    count = segment_count(seg, k)
    total = np.bincount(seg, weights=x, minlength=k or 0).astype(np.float64)
    return np.divide(total, count, out=np.zeros_like(total), where=count > 0)


def segment_std(x: np.ndarray, seg: np.ndarray, ddof: int = 1,
                k: int | None = None) -> np.ndarray:
    """Per-segment standard deviation (``ddof=1``: sample, as ``torch.std``; ``0``:
    population), shape (k,). Segments with ``count <= ddof`` give 0."""
    count = segment_count(seg, k)
    mean = segment_mean(x, seg, k)
    sq = np.bincount(seg, weights=(x - mean[seg]) ** 2, minlength=k or 0).astype(np.float64)
    denom = count - ddof
    var = np.divide(sq, denom, out=np.zeros_like(sq), where=denom > 0)
    return np.sqrt(var)


def normalize_in_segments(x: np.ndarray, seg: np.ndarray, norm: Norm,
                          member_seg: np.ndarray | None = None,
                          member_x: np.ndarray | None = None) -> np.ndarray:
    """``(x - mean_seg) / (std_seg + eps)`` (``std``) or ``x - mean_seg`` (``mean``).

    Statistics come from ``member_x`` over ``member_seg`` when given (e.g. one value per
    trajectory), else from ``x`` itself. Segments with a single member give 0.
    """
    if norm not in ("std", "mean"):
        raise ValueError(f"norm must be 'std' or 'mean', got {norm!r}")
    ms = seg if member_seg is None else member_seg
    mx = x if member_x is None else member_x
    k = int(max(seg.max(initial=-1), ms.max(initial=-1))) + 1
    count = segment_count(ms, k)
    centred = x - segment_mean(mx, ms, k)[seg]
    if norm == "std":
        centred = centred / (segment_std(mx, ms, 1, k)[seg] + EPS)
    return np.where(count[seg] >= 2, centred, 0.0)


def discounted_reverse_cumsum(x: np.ndarray, traj: np.ndarray, t: np.ndarray,
                              gamma: float) -> np.ndarray:
    """``y_t = sum_{k>=t} gamma^(k-t) x_k`` within each trajectory, rows in any order.

    Scatters the rows into a dense (n_traj, T_max) matrix and sweeps once backwards over
    time: T_max vector operations, none per row.
    """
    if len(x) == 0:
        return np.zeros(0)
    n_traj, t_max = int(traj.max()) + 1, int(t.max()) + 1
    dense = np.zeros((n_traj, t_max + 1))
    dense[traj, t] = x
    for col in range(t_max - 1, -1, -1):
        dense[:, col] += gamma * dense[:, col + 1]
    return dense[traj, t]


def shift_next(x: np.ndarray, traj: np.ndarray, t: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``x`` of the next step of the same trajectory (``fill`` at the last step)."""
    if len(x) == 0:
        return np.zeros(0)
    n_traj, t_max = int(traj.max()) + 1, int(t.max()) + 1
    dense = np.full((n_traj, t_max + 1), fill, dtype=np.float64)
    dense[traj, t] = x
    return dense[traj, t + 1]


def safe_corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation, 0.0 when either side is constant or empty."""
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])
