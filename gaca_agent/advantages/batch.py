"""The estimators' input: a batch of step rows (docs/algorithms.md "Notation").

:class:`StepBatch` holds equal-length 1-D arrays, one entry per step row, in any order.
:func:`prepare` validates it once and derives what every estimator needs (dense ids for
groups, trajectories and anchor states; episode returns; discounted returns-to-go), all
vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np

from gaca_agent.advantages.stats import discounted_reverse_cumsum, factorize, pair_ids


def _array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


@dataclass(frozen=True)
class StepBatch:
    """One row per environment step. See docs/algorithms.md for each field's meaning.

    ``state``/``next_state``/``action`` are codes of the canonical keys (ints or strings);
    ``nll`` and ``entropy`` are per-token means of the step's response. ``observation``
    (raw texts) is only needed for GiGPO's optional similarity grouping. ``penalty`` is a
    per-row score added *after* discounting, verl-agent's invalid-action penalty: it
    shifts the row's episode score (R_i + penalty) and its return-to-go (G_t + penalty)
    but enters neither R_i of the other rows nor any G_t (None: all zero).
    """

    group: Any
    traj: Any
    t: Any
    reward: Any
    state: Any
    next_state: Any = None
    action: Any = None
    nll: Any = None
    terminal: Any = None
    entropy: Any = None
    observation: Sequence[str] | None = None
    penalty: Any = None

    def __len__(self) -> int:
        return len(_array(self.group))


@dataclass(frozen=True)
class Prepared:
    """Validated arrays of a batch plus the derived quantities, aligned with its rows."""

    n: int
    group: np.ndarray  # (n,) dense task-group id
    traj: np.ndarray  # (n,) dense trajectory id
    traj_group: np.ndarray  # (n_traj,) group id of each trajectory
    t: np.ndarray  # (n,) step index
    reward: np.ndarray  # (n,) float64
    state: np.ndarray  # (n,) raw state codes
    anchor: np.ndarray  # (n,) dense (group, state) id
    episode_return: np.ndarray  # (n_traj,) R_i = sum_t r_t
    penalty: np.ndarray  # (n,) row penalty applied after discounting (zeros if none)
    batch: StepBatch

    @property
    def n_traj(self) -> int:
        return len(self.traj_group)

    @property
    def n_groups(self) -> int:
        return int(self.group.max()) + 1 if self.n else 0

    def field(self, name: str, required_by: str) -> np.ndarray:
        """An optional field as an array, or an error naming the estimator that needs it."""
        value = getattr(self.batch, name)
        if value is None:
            raise ValueError(f"{required_by} needs the step rows' `{name}` field")
        arr = _array(value)
        if arr.shape != (self.n,):
            raise ValueError(f"`{name}` has shape {arr.shape}, expected ({self.n},)")
        return arr

    def returns_to_go(self, gamma: float) -> np.ndarray:
        """G_t = sum_{k>=t} gamma^(k-t) r_k along each trajectory, plus the row's penalty
        (if any), shape (n,)."""
        return discounted_reverse_cumsum(self.reward, self.traj, self.t, gamma) + self.penalty

    def group_spread(self) -> np.ndarray:
        """Per task group, whether its trajectories' returns R_i are not all exactly
        equal (row penalties are not part of R_i), shape (n_groups,) bool."""
        high, low = np.full(self.n_groups, -np.inf), np.full(self.n_groups, np.inf)
        np.maximum.at(high, self.traj_group, self.episode_return)
        np.minimum.at(low, self.traj_group, self.episode_return)
        return high > low

    def row_scores(self) -> np.ndarray:
        """Each row's episode score R_i + penalty, shape (n,)."""
        return self.episode_return[self.traj] + self.penalty


def prepare(batch: StepBatch) -> Prepared:
    """Validate a batch (equal lengths, contiguous t per trajectory) and derive ids."""
    cols = {f.name: getattr(batch, f.name) for f in fields(batch)}
    required = ("group", "traj", "t", "reward", "state")
    arrays = {k: _array(cols[k]) for k in required}
    n = len(arrays["group"])
    for name, arr in arrays.items():
        if arr.ndim != 1 or len(arr) != n:
            raise ValueError(f"`{name}` must be a 1-D array of length {n}, got {arr.shape}")
    for name in ("next_state", "action", "nll", "terminal", "entropy", "penalty"):
        if cols[name] is not None and _array(cols[name]).shape != (n,):
            raise ValueError(f"`{name}` must be a 1-D array of length {n}")
    if batch.observation is not None and len(batch.observation) != n:
        raise ValueError(f"`observation` must have {n} entries")
    reward = arrays["reward"].astype(np.float64)
    if not np.all(np.isfinite(reward)):
        raise ValueError("`reward` has non-finite values")
    penalty = (np.zeros(n) if cols["penalty"] is None
               else _array(cols["penalty"]).astype(np.float64))
    if not np.all(np.isfinite(penalty)):
        raise ValueError("`penalty` has non-finite values")
    group = factorize(arrays["group"])
    traj = factorize(arrays["traj"])
    t = arrays["t"].astype(np.int64)
    n_traj = int(traj.max()) + 1 if n else 0
    traj_group = np.full(n_traj, -1, dtype=np.int64)
    traj_group[traj] = group
    if n and np.any(traj_group[traj] != group):
        raise ValueError("a trajectory's rows carry more than one `group`")
    lengths = np.bincount(traj, minlength=n_traj)
    if n and (t.min() < 0 or np.any(np.bincount(traj, weights=t, minlength=n_traj)
                                    != lengths * (lengths - 1) / 2)
              or len(np.unique(pair_ids(traj, t))) != n):
        raise ValueError("each trajectory's `t` must be 0..T-1, each step once")
    return Prepared(
        n=n, group=group, traj=traj, traj_group=traj_group, t=t, reward=reward,
        state=arrays["state"], anchor=pair_ids(group, factorize(arrays["state"])),
        episode_return=np.bincount(traj, weights=reward, minlength=n_traj), penalty=penalty,
        batch=batch)


def rows_of_groups_with_spread(batch: StepBatch) -> np.ndarray:
    """True for each row whose task group's trajectories did not all earn the same return
    R_i, shape (n,) bool: DAPO's filter of "dynamic sampling", which trains only on groups
    whose outcomes differ. A group whose episodes all returned alike has no episode-level
    advantage; its rows would add only step-level credit (which GiGPO gives a group that
    won every episode by different routes) and the KL term's cost. Row penalties are not
    part of R_i, so a group that differs only in them counts as alike."""
    p = prepare(batch)
    return p.group_spread()[p.group]
