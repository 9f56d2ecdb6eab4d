"""Environment worker processes: several envs per process, batched commands, restarts.

:class:`EnvPool` spreads ``num_envs`` env slots over ``num_workers`` spawned processes
(slot j lives in worker ``j % num_workers``). Each call sends one batch of commands to
every worker that has work, then gathers the answers, so workers step in parallel. A
worker that dies or stops answering is restarted; the slots it held answer with
:class:`WorkerFailure` so that the caller can mark those episodes failed.

A worker is also recycled after ``recycle_after`` resets (ALFWorld processes grow with
every new game), but never under a live episode: from then on it is *draining*
(:meth:`EnvPool.draining`: the caller starts no new episode on its slots), and
:meth:`EnvPool.recycle_idle` replaces it once none of its slots is mid-episode. Workers
ignore SIGINT: a Ctrl-C is the parent's to handle (it closes the pool).
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerFailure:
    """An env command that could not be answered (the env raised, or its worker died)."""

    message: str


def _serve(conn, env_id: str, env_kwargs: dict, num_envs: int) -> None:
    import signal

    import gymnasium as gym

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import gaca_envs

    gym.register_envs(gaca_envs)
    envs: dict[int, Any] = {}

    def env(i: int):
        if i not in envs:
            envs[i] = gym.make(env_id, **env_kwargs)
        return envs[i]

    def expert(i: int):
        fn = getattr(env(i).unwrapped, "expert_action", None)
        return fn() if fn else None

    handlers = {
        "reset": lambda i, arg: env(i).reset(seed=arg[0], options=arg[1]),
        "step": lambda i, arg: env(i).step(arg),
        "expert": lambda i, arg: expert(i),
        "pid": lambda i, arg: mp.current_process().pid,
    }
    while True:
        try:
            cmd, items = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            break
        answers = []
        for i, arg in items:
            try:
                answers.append((i, handlers[cmd](i, arg)))
            except Exception as err:  # noqa: BLE001 - reported to the caller, per env
                answers.append((i, WorkerFailure(f"{type(err).__name__}: {err}\n"
                                                 f"{traceback.format_exc(limit=3)}")))
        conn.send(answers)
    for e in envs.values():
        e.close()


class EnvPool:
    """``num_envs`` environment slots in ``num_workers`` processes (spawned)."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None, num_envs: int = 1,
                 num_workers: int = 1, recycle_after: int | None = None,
                 timeout_s: float = 600.0) -> None:
        if num_workers < 1 or num_envs < 1:
            raise ValueError("num_envs and num_workers must be >= 1")
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.num_envs, self.num_workers = num_envs, min(num_workers, num_envs)
        self.recycle_after, self.timeout_s = recycle_after, timeout_s
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = [None] * self.num_workers
        self._conns: list[Any] = [None] * self.num_workers
        self._resets = [0] * self.num_workers
        self.restarts = 0
        self.recycles = 0
        for w in range(self.num_workers):
            self._start(w)

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        n_local = len(range(w, self.num_envs, self.num_workers))
        proc = self._ctx.Process(target=_serve, args=(child, self.env_id, self.env_kwargs,
                                                      n_local), daemon=True)
        proc.start()
        child.close()
        self._procs[w], self._conns[w], self._resets[w] = proc, parent, 0

    def _restart(self, w: int) -> None:
        proc = self._procs[w]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(timeout=10)
        self._start(w)
        self.restarts += 1

    def worker_of(self, slot: int) -> int:
        return slot % self.num_workers

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def draining(self, slot: int) -> bool:
        """Whether the worker of ``slot`` is due for recycling (start nothing new there)."""
        return bool(self.recycle_after) and \
            self._resets[self.worker_of(slot)] >= self.recycle_after  # type: ignore[operator]

    def recycle_idle(self, busy_workers: set[int]) -> int:
        """Replace every draining worker that holds no live episode (``busy_workers``:
        the workers that do); returns how many were replaced."""
        n = 0
        for w in range(self.num_workers):
            if w not in busy_workers and self.recycle_after and \
                    self._resets[w] >= self.recycle_after:
                self._restart(w)
                self.restarts -= 1  # planned recycling, not a failure
                self.recycles += 1
                n += 1
        return n

    def call(self, cmd: str, items: list[tuple[int, Any]]) -> dict[int, Any]:
        """Run ``cmd`` for (slot, argument) pairs; returns slot -> answer or WorkerFailure."""
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for slot, arg in items:
            by_worker.setdefault(self.worker_of(slot), []).append((slot // self.num_workers, arg))
        sent = []
        for w, local in by_worker.items():
            try:
                self._conns[w].send((cmd, local))
                sent.append(w)
            except (BrokenPipeError, OSError):
                pass
        results: dict[int, Any] = {}
        for w, local in by_worker.items():
            answers = self._receive(w) if w in sent else None
            if answers is None:
                self._restart(w)
                for i, _ in local:
                    results[i * self.num_workers + w] = WorkerFailure(
                        f"env worker {w} died or stopped answering; restarted")
                continue
            if cmd == "reset":
                self._resets[w] += len(local)
            for i, answer in answers:
                results[i * self.num_workers + w] = answer
        return results

    def _receive(self, w: int):
        conn = self._conns[w]
        try:
            if not conn.poll(self.timeout_s):
                return None
            return conn.recv()
        except (EOFError, OSError):
            return None

    def close(self) -> None:
        for w in range(self.num_workers):
            try:
                self._conns[w].send(("close", []))
            except (BrokenPipeError, OSError, AttributeError):
                pass
        for proc in self._procs:
            if proc is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
