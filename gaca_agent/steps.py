"""The one representation of a step between the environment and the loss: a row of a
columnar :class:`StepTable`.

The collector appends each step's values straight into the table's columns
(:class:`TableBuilder`); the estimators read its scalar columns (their
:class:`~gaca_agent.advantages.StepBatch` is a view of them, same names); the learner pads
its token columns into the loss tensors. Scalar columns are numpy arrays; texts are lists;
token ids and log-probs are ragged columns (one flat array plus offsets), so no per-step
objects are rebuilt anywhere, and multi-process training gathers only the scalar columns
that group statistics need (:meth:`StepTable.scalars`): each rank keeps its own tokens.

State and action codes are stable 63-bit hashes of the texts (``state_key``, the
normalised action), equal in every process, so rows from several ranks group correctly
without a shared dictionary. ``obs_state``/``obs_next_state`` code the observation texts
before and after the step: GiGPO's anchor (``scalars(anchor="observation")``).
``advantage`` and ``weight`` are NaN until the training loop attaches them
(:meth:`Rollout.attach`), on the rows it trained on. ``policy_version`` is the weight
version that sampled the step (-1: unknown, e.g. a scripted policy).

:meth:`StepTable.record` is the on-disk form of a row (``episodes.jsonl``), kept stable
for saved runs: there ``action`` is the action text and ``terminated`` the terminal flag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

#: Scalar columns and their dtypes.
SCALARS: dict[str, Any] = {
    "episode": np.int64, "group": np.int64, "traj": np.int64, "t": np.int64,
    "reward": np.float64, "env_reward": np.float64, "terminal": bool, "truncated": bool,
    "format_valid": bool, "action_valid": bool, "failed": bool,
    "nll": np.float64, "nll_response": np.float64, "nll_action": np.float64,
    "nll_think": np.float64, "entropy": np.float64,
    "state": np.int64, "next_state": np.int64, "action": np.int64, "penalty": np.float64,
    "obs_state": np.int64, "obs_next_state": np.int64,
    "advantage": np.float64, "weight": np.float64, "policy_version": np.int64,
}
#: Scalar columns a step may leave out when appended (filled in later or unknown).
DEFAULTS: dict[str, Any] = {"episode": 0, "failed": False, "advantage": np.nan,
                            "weight": np.nan, "policy_version": -1}
#: Text columns (Python lists).
TEXTS = ("observation", "response", "action_text", "state_key", "next_state_key",
         "admissible_actions", "info")
#: Ragged columns: per-row token ids and log-probs.
RAGGED: dict[str, Any] = {"prompt_ids": np.int64, "completion_ids": np.int64,
                          "logprobs": np.float64}
#: What the estimators read (docs/algorithms.md's step-row fields; StepBatch's names).
ESTIMATOR_FIELDS = ("group", "traj", "t", "reward", "state", "next_state", "action", "nll",
                    "terminal", "entropy", "penalty")


def code(text: str) -> int:
    """A process-independent 63-bit code of a text (state keys, action texts)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def action_code(text: str) -> int:
    """The code of an action's canonical form (the envs' own normalisation: lower case,
    whitespace collapsed), which the estimators group actions by."""
    from gaca_envs.core import normalize_action

    return code(normalize_action(text))


@dataclass(frozen=True)
class Ragged:
    """Variable-length rows: row i is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[Any] | None], dtype) -> "Ragged":
        lengths = np.fromiter((len(r) if r is not None else 0 for r in rows), np.int64,
                              len(rows))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        parts = [np.asarray(r, dtype=dtype) for r in rows if r is not None and len(r)]
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        return cls(flat, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, rows: np.ndarray) -> "Ragged":
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.offsets[rows], self.lengths()[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Ragged(self.values[index], offsets)


@dataclass
class StepTable:
    """Step rows in columns; see the module docstring."""

    columns: dict[str, np.ndarray]
    texts: dict[str, list]
    ragged: dict[str, Ragged]

    def __len__(self) -> int:
        return len(self.columns["t"])

    def __getitem__(self, name: str):
        if name in self.columns:
            return self.columns[name]
        if name in self.texts:
            return self.texts[name]
        return self.ragged[name]

    @classmethod
    def from_tokens(cls, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                    logprobs: Sequence[Sequence[float]]) -> "StepTable":
        """A table of bare token rows (one trajectory each, no texts): how to hand the
        learner sequences that did not come from the collector (benchmarks, the GPU
        check, your own data)."""
        out = TableBuilder()
        for i, (p, c, lp) in enumerate(zip(prompts, completions, logprobs)):
            row: dict[str, Any] = {**{k: 0 for k in SCALARS if k not in DEFAULTS},
                                   **{k: "" for k in TEXTS}}
            row.update(episode=i, group=i, traj=i, entropy=float("nan"), format_valid=True,
                       action_valid=True, terminal=True, truncated=False,
                       admissible_actions=(), info={}, prompt_ids=list(p),
                       completion_ids=list(c), logprobs=list(lp))
            out.append(**row)
        return out.table()

    @classmethod
    def concat(cls, tables: Iterable["StepTable"]) -> "StepTable":
        """The rows of ``tables`` one after the other (they hold the same columns)."""
        tables = list(tables)
        first = tables[0]
        columns = {k: np.concatenate([t.columns[k] for t in tables]) for k in first.columns}
        texts = {k: [x for t in tables for x in t.texts[k]] for k in first.texts}
        ragged = {}
        for k in first.ragged:
            parts = [t.ragged[k] for t in tables]
            shift = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
            offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift)])
            ragged[k] = Ragged(np.concatenate([p.values for p in parts]), offsets.astype(np.int64))
        return cls(columns, texts, ragged)

    def take(self, rows) -> "StepTable":
        """The rows ``rows`` (indices or a boolean mask), in that order."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return StepTable({k: v[rows] for k, v in self.columns.items()},
                         {k: [v[int(i)] for i in rows] for k, v in self.texts.items()},
                         {k: v.take(rows) for k, v in self.ragged.items()})

    def with_columns(self, **extra: "np.ndarray | Ragged") -> "StepTable":
        """The same rows with columns added or replaced (no copies of the others)."""
        ragged = {k: v for k, v in extra.items() if isinstance(v, Ragged)}
        scalars = {k: np.asarray(v) for k, v in extra.items() if not isinstance(v, Ragged)}
        return StepTable({**self.columns, **scalars}, self.texts, {**self.ragged, **ragged})

    def scalars(self, with_observation: bool = False, anchor: str = "state") -> "StepTable":
        """The columns the estimators read (small: what ranks gather), as a table.
        ``anchor``: ``state`` groups rows by canonical state keys, ``observation`` by the
        exact observation text (GiGPO's)."""
        if anchor not in ("state", "observation"):
            raise ValueError(f"anchor must be 'state' or 'observation', got {anchor!r}")
        columns = {k: self.columns[k] for k in ESTIMATOR_FIELDS}
        if anchor == "observation":
            columns["state"], columns["next_state"] = (self.columns["obs_state"],
                                                       self.columns["obs_next_state"])
        texts = {"observation": list(self.texts["observation"])} if with_observation else {}
        return StepTable(columns, texts, {})

    def record(self, i: int, tokens: bool = False) -> dict[str, Any]:
        """Row ``i`` as a plain dict (for episode files and reports); with ``tokens``
        also its ``prompt_ids``, ``response_ids`` and the sampler's ``logprobs``."""
        c, x = self.columns, self.texts
        extra = {}
        if tokens and self.ragged:
            extra = {"prompt_ids": self.ragged["prompt_ids"][i].tolist(),
                     "response_ids": self.ragged["completion_ids"][i].tolist(),
                     "logprobs": self.ragged["logprobs"][i].tolist()}
        return {"t": int(c["t"][i]), "observation": x["observation"][i],
                "admissible_actions": list(x["admissible_actions"][i]),
                "response": x["response"][i], "action": x["action_text"][i],
                "penalty": float(c["penalty"][i]),
                "format_valid": bool(c["format_valid"][i]),
                "action_valid": bool(c["action_valid"][i]), "reward": float(c["reward"][i]),
                "env_reward": float(c["env_reward"][i]), "state_key": x["state_key"][i],
                "next_state_key": x["next_state_key"][i],
                "terminated": bool(c["terminal"][i]), "truncated": bool(c["truncated"][i]),
                "nll": float(c["nll"][i]),
                "nll_spans": {s: float(c[f"nll_{s}"][i]) for s in ("response", "action", "think")},
                "entropy": None if np.isnan(c["entropy"][i]) else float(c["entropy"][i]),
                **{k: float(c[k][i]) for k in ("advantage", "weight") if not np.isnan(c[k][i])},
                **({"policy_version": int(c["policy_version"][i])}
                   if c["policy_version"][i] >= 0 else {}),
                "info": dict(x["info"][i]), **extra}


def step_batch(table: StepTable):
    """The estimators' :class:`StepBatch` over a table's scalar columns (no copies; an
    unknown entropy falls back to the NLL)."""
    from gaca_agent.advantages import StepBatch

    c = table.columns
    entropy = np.asarray(c["entropy"], dtype=np.float64)
    nll = np.asarray(c["nll"], dtype=np.float64)
    return StepBatch(group=c["group"], traj=c["traj"], t=c["t"], reward=c["reward"],
                     state=c["state"], next_state=c["next_state"], action=c["action"],
                     nll=nll, terminal=c["terminal"],
                     entropy=np.where(np.isnan(entropy), nll, entropy),
                     observation=table.texts.get("observation"), penalty=c["penalty"])


class TableBuilder:
    """Column buffers a step table is appended to, one step at a time."""

    def __init__(self) -> None:
        self._columns: dict[str, list] = {k: [] for k in (*SCALARS, *TEXTS, *RAGGED)}

    def __len__(self) -> int:
        return len(self._columns["t"])

    def append(self, **values: Any) -> None:
        """One step: every column's value (``DEFAULTS`` may be left out)."""
        unknown = set(values) - set(self._columns)
        if unknown:
            raise KeyError(f"unknown step column(s) {sorted(unknown)}")
        for key, column in self._columns.items():
            column.append(values[key] if key in values else DEFAULTS[key])

    def table(self, **fill: Any) -> StepTable:
        """The table of the appended steps; ``fill`` sets a scalar column on every row."""
        n, cols = len(self), self._columns
        columns = {k: np.full(n, fill[k], dtype=t) if k in fill else np.asarray(cols[k], dtype=t)
                   for k, t in SCALARS.items()}
        texts = {k: list(cols[k]) for k in TEXTS}
        ragged = {k: Ragged.from_lists(cols[k], t) for k, t in RAGGED.items()}
        return StepTable(columns, texts, ragged)


@dataclass
class Episode:
    """An episode's metadata; its steps are the rows ``rows`` of the rollout's table.
    ``failed`` episodes carry the ``error`` that ended them."""

    group: int
    traj: int
    task_id: int
    seed: int | None
    task: str = ""
    task_type: str | None = None
    final_observation: str = ""
    won: bool = False
    score: float = 0.0
    failed: bool = False
    error: str = ""
    length: int = 0
    total_reward: float = 0.0
    rows: range = field(default_factory=lambda: range(0))


@dataclass
class Rollout:
    """Episodes and their step rows (rows of one episode are contiguous, in step order)."""

    episodes: list[Episode]
    table: StepTable

    def steps(self, episode: Episode, tokens: bool = False) -> list[dict[str, Any]]:
        return [self.table.record(i, tokens) for i in episode.rows]

    @property
    def train_rows(self) -> np.ndarray:
        """Indices of the rows of episodes that did not fail (failed ones are partial)."""
        return np.flatnonzero(~self.table.columns["failed"])

    def training_table(self) -> StepTable:
        """The rows :attr:`train_rows`, in order: what the estimators and learner get."""
        return self.table.take(self.train_rows)

    def attach(self, **columns: np.ndarray) -> None:
        """Per-row values of the training table (advantage, weight) written back onto
        :attr:`train_rows` of the rollout's table; the other rows keep NaN."""
        rows = self.train_rows
        for key, values in columns.items():
            if len(values) != len(rows):
                raise ValueError(f"{len(values)} values of {key} for {len(rows)} training rows")
            full = np.full(len(self.table), np.nan)
            full[rows] = values
            self.table.columns[key] = full
