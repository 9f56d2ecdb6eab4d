"""Where the learner's batches come from: collected just in time (lock-step, ``max_staleness:
0``) or ahead of the learner on a thread (asynchronous, ``max_staleness: K`` >= 1).

Asynchronous schedule. Iteration j's rollouts are sampled by weight version j - K (0
while j < K): the producer starts iteration j once that version is synced (admission:
nothing it samples is more than K versions behind the learner that trains on it), and
pins every turn of the iteration to it (``partial_rollouts: false``; with it on, each
turn takes the newest weights, never older than j - K). The learner meanwhile trains on
iteration j - 1, ... So collection and updates overlap, and because each iteration's
version is fixed by the schedule, not by timing, a run is as reproducible as the
lock-step one.

A server that serves one set of full weights at a time cannot swap to version v while
the producer still samples an iteration pinned to v - 1: the sync first waits for it
(:meth:`Producer.before_sync`). LoRA adapters stay loaded side by side (the window of
K + 1), so no sync waits.

Exact resume: a checkpoint after iteration i holds the batches of i + 1 .. i + K, which
were collected before it was written (:meth:`Producer.ahead`); the resumed producer
starts at i + K + 1 with the checkpoint's weights, version i + 1: what the uninterrupted
run would have used. A checkpoint that kept fewer (the last one of a finished run that
``--resume ... iterations=N`` extends, or a larger ``max_staleness`` than the run had)
leaves iterations whose version is older than the checkpoint's: the server no longer has
it, so they are sampled by the checkpoint's weights (no version is older than the one a
producer starts with).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """The version window of ``max_staleness`` K: iteration j is sampled by weight version
    j - K (never older than the oldest the server still has), so the server serves the
    last K + 1 versions (LoRA adapters side by side) and the sync keeps their files."""

    staleness: int = 0

    @property
    def served(self) -> int:
        """Versions the server keeps, and the sync's files: K + 1."""
        return self.staleness + 1

    def version_for(self, iteration: int, oldest: int = 0) -> int:
        return max(oldest, iteration - self.staleness)


@dataclass
class Batch:
    """One iteration's rollouts (this rank's share) and how it was collected."""

    iteration: int
    rollout: Any
    seconds: float
    version: int | None = None
    """The weight version every turn was pinned to (None: not pinned)."""


class ProducerStopped(RuntimeError):
    """The producer thread failed; the learner stops with its reason."""


class Lockstep:
    """Each batch collected when the learner asks for it (its collection seeds torch)."""

    waited = 0.0

    def __init__(self, collect: Callable[[int, int | None], Batch]) -> None:
        self.collect = collect

    def get(self, iteration: int) -> Batch:
        return self.collect(iteration, None)

    def train_table(self, batch: Batch, seed: Callable[[int], None]) -> tuple[Any, int]:
        """The rows the update trains on, and the task groups dropped as too stale (none)."""
        return batch.rollout.training_table(), 0

    def report(self, acc, table, iteration: int, dropped: int) -> dict[str, float]:
        return {}

    def before_sync(self, version: int) -> None:
        pass

    def after_sync(self, version: int) -> None:
        pass

    def ahead(self, iteration: int) -> list[Batch]:
        return []

    def close(self) -> None:
        pass


class Producer:
    """Collects iterations ``start`` .. ``stop - 1`` ahead of the learner (see the module
    docstring); ``ready``: batches already collected (a resumed run's checkpoint)."""

    def __init__(self, collect: Callable[[int, int | None], Batch], start: int, stop: int,
                 staleness: int, synced: int, pinned: bool = True, drain: bool = False,
                 ready: list[Batch] | None = None) -> None:
        if staleness < 1:
            raise ValueError(f"a producer runs ahead by max_staleness >= 1, got {staleness}")
        self.collect, self.stop, self.k = collect, stop, staleness
        self.schedule = Schedule(staleness)
        self.reported_wait = 0.0  # of ``waited``, what the metrics have reported
        self.pinned, self.drain = pinned, drain
        self.ready: dict[int, Batch] = {b.iteration: b for b in ready or []}
        self.synced = synced  # the newest weight version the server has
        self.oldest = synced  # older versions are not on the server (a resumed run)
        self.collected = max([start - 1, *self.ready])  # every iteration up to it is done
        self.error: BaseException | None = None
        self.stopping = False
        self.waited = 0.0  # seconds the learner waited for batches
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gaca-producer", daemon=True)
        self._thread.start()

    def version_for(self, iteration: int) -> int:
        return self.schedule.version_for(iteration, self.oldest)

    def train_table(self, batch: Batch, seed: Callable[[int], None]) -> tuple[Any, int]:
        """The rows the update trains on (task groups sampled more than K versions back
        dropped: the guard behind the schedule), and how many groups were dropped. The
        update is seeded here: the producer's thread does not seed torch."""
        seed(batch.iteration)
        dropped = drop_stale(batch.rollout, batch.iteration, self.k)
        return batch.rollout.training_table(), dropped

    def report(self, acc, table, iteration: int, dropped: int) -> dict[str, float]:
        """Staleness of the trained tokens, groups dropped and the learner's wait since
        the last report (for this batch, and for the producer before the sync)."""
        waited, self.reported_wait = self.waited - self.reported_wait, self.waited
        return staleness_metrics(acc, table, iteration, dropped, waited)

    def _run(self) -> None:
        try:
            for j in range(self.collected + 1, self.stop):
                version = self.version_for(j)
                with self._cv:
                    self._cv.wait_for(lambda: self.synced >= version or self.stopping)
                    if self.stopping:
                        return
                batch = self.collect(j, version if self.pinned else None)
                with self._cv:
                    self.ready[j] = batch
                    self.collected = j
                    self._cv.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the learner
            with self._cv:
                self.error = err
                self._cv.notify_all()

    def _wait(self, done: Callable[[], bool]) -> None:
        t0 = time.perf_counter()
        with self._cv:
            self._cv.wait_for(lambda: done() or self.error is not None)
            if self.error is not None and not done():
                raise ProducerStopped(f"collecting rollouts failed: "
                                      f"{type(self.error).__name__}: {self.error}") \
                    from self.error
        self.waited += time.perf_counter() - t0

    def get(self, iteration: int) -> Batch:
        """Iteration ``iteration``'s batch, once collected."""
        self._wait(lambda: iteration in self.ready)
        with self._cv:
            return self.ready.pop(iteration)

    def before_sync(self, version: int) -> None:
        """With one served version at a time (full weights, pinned turns): wait until no
        iteration left to collect is pinned to an older version than ``version``."""
        if self.drain and self.pinned:
            last = min(version - 1 + self.k, self.stop - 1)
            self._wait(lambda: self.collected >= last)

    def after_sync(self, version: int) -> None:
        with self._cv:
            self.synced = version
            self._cv.notify_all()

    def ahead(self, iteration: int) -> list[Batch]:
        """The batches after ``iteration`` up to ``iteration + K``, once collected (what
        a checkpoint after ``iteration`` keeps)."""
        last = min(iteration + self.k, self.stop - 1)
        self._wait(lambda: self.collected >= last)
        with self._cv:
            return [self.ready[j] for j in sorted(self.ready) if iteration < j <= last]

    def close(self) -> None:
        with self._cv:
            self.stopping = True
            self._cv.notify_all()


def drop_stale(rollout, iteration: int, staleness: int) -> int:
    """Mark failed (so they are not trained on) the episodes of every task group with a
    step sampled more than ``staleness`` versions before ``iteration``; how many groups.
    (The producer's schedule never lets that happen; this is the guard behind it.)"""
    table = rollout.table
    old = table["policy_version"] < iteration - staleness
    stale = set(table["group"][old & (table["policy_version"] >= 0)].tolist())
    for ep in rollout.episodes:
        if ep.group in stale and not ep.failed:
            ep.failed, ep.error = True, (f"dropped: sampled more than {staleness} weight "
                                         f"versions before update {iteration}")
    if stale:
        table.columns["failed"] = table["failed"] | np.isin(table["group"], list(stale))
    return len(stale)


def staleness_metrics(acc, table, iteration: int, dropped: int,
                      waited_s: float) -> dict[str, float]:
    """How many versions behind the learner the trained tokens were sampled (min, mean
    over tokens, max; over every rank), task groups dropped, and the learner's wait."""
    import torch

    behind = iteration - table["policy_version"]
    tokens = table["completion_ids"].lengths().astype(np.float64)
    known = table["policy_version"] >= 0
    values = [float((behind * tokens)[known].sum()), float(tokens[known].sum()),
              float(dropped), waited_s]
    low = float(behind[known].min()) if known.any() else float("inf")
    high = float(behind[known].max()) if known.any() else float("-inf")
    if acc.num_processes > 1:
        t = torch.tensor(values, dtype=torch.float64, device=acc.device)
        values = acc.reduce(t, reduction="sum").tolist()
        ends = acc.gather(torch.tensor([[low, high]], dtype=torch.float64, device=acc.device))
        low, high = float(ends[:, 0].min()), float(ends[:, 1].max())
    weighted, n, dropped_all, waited = values
    return {"async/stale_min": low if n else 0.0, "async/stale_max": high if n else 0.0,
            "async/stale_mean": weighted / n if n else 0.0,
            "async/dropped_groups": dropped_all,
            "async/wait_s": waited / max(acc.num_processes, 1)}



def save_ahead(checkpoint: Path, rank: int, batches) -> None:
    """The batches a checkpoint keeps (collected ahead of the learner, asynchronous
    training), this rank's share."""
    import pickle

    with open(checkpoint / f"ahead.rank{rank}.pkl", "wb") as f:
        pickle.dump(list(batches), f)


def load_ahead(checkpoint: Path, rank: int) -> list:
    """The batches :func:`save_ahead` kept (none for a lock-step run's checkpoint)."""
    import pickle

    path = checkpoint / f"ahead.rank{rank}.pkl"
    if not path.exists():
        return []
    with open(path, "rb") as f:
        return pickle.load(f)
