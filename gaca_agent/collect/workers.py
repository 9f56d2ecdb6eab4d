"""Environment worker processes: several envs per process, batched commands, restarts.

:class:`EnvPool` spreads ``num_envs`` env slots over ``num_workers`` spawned processes
(slot j lives in worker ``j % num_workers``); each worker runs an :class:`EnvHost`
behind its pipe. The routing, restarts and recycling are :class:`HostPool`'s, which the
Ray backend's actors (:mod:`gaca_agent.cluster`) share with another transport. Each call
sends one batch of commands to every worker that has work, then gathers the answers, so
workers step in parallel. A worker that dies or stops answering is restarted; the slots
it held answer with :class:`WorkerFailure` so that the caller can mark those episodes
failed.

A worker is also recycled after ``recycle_after`` resets (ALFWorld processes grow with
every new game), but never under a live episode: from then on it is *draining*
(:meth:`EnvPool.draining`: the caller starts no new episode on its slots), and
:meth:`EnvPool.recycle_idle` replaces it once none of its slots is mid-episode. Workers
ignore SIGINT: a Ctrl-C is the parent's to handle (it closes the pool).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerFailure:
    """An env command that could not be answered (the env raised, or its worker died)."""

    message: str
    lost: bool = False
    """The env's host was lost (its process, actor, node or server), not the env at fault:
    the episode can be played again from its seed (``env.rerun_lost``)."""


class EnvHost:
    """The envs of one worker, by local index, and the commands they answer: the env code
    every transport runs (a worker process's pipe here). Envs are made on first use."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None) -> None:
        import gymnasium as gym

        import gaca_envs

        gym.register_envs(gaca_envs)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.envs: dict[int, Any] = {}

    def env(self, i: int):
        if i not in self.envs:
            import gymnasium as gym

            self.envs[i] = gym.make(self.env_id, **self.env_kwargs)
        return self.envs[i]

    def reset(self, i: int, arg: tuple[int | None, dict | None]):
        seed, options = arg
        try:
            return self.env(i).reset(seed=seed, options=options)
        except Exception:
            # a reset that raised can leave the env half set up (gymnasium's checker then
            # fails the next episode's first step): the slot's next reset makes a new one
            self.envs.pop(i).close()
            raise

    def step(self, i: int, action: str):
        return self.env(i).step(action)

    def expert(self, i: int, _arg=None) -> str | None:
        fn = getattr(self.env(i).unwrapped, "expert_action", None)
        return fn() if fn else None

    def pid(self, i: int, _arg=None) -> int:
        return os.getpid()

    def handle(self, cmd: str, items: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """``cmd`` (reset, step, expert or pid) for each (local index, argument): its
        answer, or a :class:`WorkerFailure` with the error for that env alone."""
        answers = []
        for i, arg in items:
            try:
                if cmd not in ("reset", "step", "expert", "pid"):
                    raise ValueError(f"unknown env command {cmd!r}")
                answers.append((i, getattr(self, cmd)(i, arg)))
            except Exception as err:  # noqa: BLE001 - reported to the caller, per env
                answers.append((i, WorkerFailure(f"{type(err).__name__}: {err}\n"
                                                 f"{traceback.format_exc(limit=3)}")))
        return answers

    def close(self) -> None:
        for e in self.envs.values():
            e.close()
        self.envs.clear()


def serve_pipe(conn, host: EnvHost) -> None:
    """Answer ``(cmd, items)`` batches from ``conn`` with ``host`` until the pipe closes
    or says ``close``; then close the envs."""
    try:
        while True:
            try:
                cmd, items = conn.recv()
            except (EOFError, KeyboardInterrupt):
                break
            if cmd == "close":
                break
            conn.send(host.handle(cmd, items))
    finally:
        host.close()


def _worker_main(conn, env_id: str, env_kwargs: dict) -> None:
    """A worker process: Ctrl-C is the parent's to handle (it closes the pool)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_pipe(conn, EnvHost(env_id, env_kwargs))


STARTUP_GRACE_S = 120.0
"""Added to ``timeout_s`` for a host's first answer: starting a process (or an actor) on
a loaded machine can take longer than a step may."""


class HostPool:
    """``num_envs`` env slots on ``num_workers`` hosts that each run an :class:`EnvHost`
    (slot j on host ``j % num_workers``): slot routing, restarts and recycling, in one
    place for every transport. A subclass says how to start a host (:meth:`_start`), send
    it a batch (:meth:`_send`), receive its answers within a given time or None
    (:meth:`_receive`) and stop it (:meth:`_stop`). One call's hosts share one deadline,
    ``timeout_s`` after it was sent: k stuck hosts cost ``timeout_s``, not k times it."""

    def __init__(self, num_envs: int, num_workers: int, recycle_after: int | None,
                 timeout_s: float) -> None:
        if num_workers < 1 or num_envs < 1:
            raise ValueError("num_envs and num_workers must be >= 1")
        self.num_envs, self.num_workers = num_envs, min(num_workers, num_envs)
        self.recycle_after, self.timeout_s = recycle_after, timeout_s
        self._resets = [0] * self.num_workers
        self._lost: set[int] = set()  # slots whose env went with a replaced worker
        self._fresh: set[int] = set()  # hosts started that have not answered yet
        self.restarts = 0
        self.recycles = 0
        self.expert = False  # local envs answer expert calls whenever asked

    def _start(self, w: int) -> None:
        raise NotImplementedError

    def _send(self, w: int, cmd: str, items: list[tuple[int, Any]]) -> bool:
        raise NotImplementedError

    def _receive(self, w: int, timeout_s: float):
        raise NotImplementedError

    def _stop(self, w: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _restart(self, w: int) -> None:
        self._stop(w)
        self._start(w)
        self._fresh.add(w)
        self._resets[w] = 0
        self.restarts += 1

    def worker_of(self, slot: int) -> int:
        return slot % self.num_workers

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
        """Run ``cmd`` for (slot, argument) pairs; returns slot -> answer or WorkerFailure.
        A slot whose worker was replaced while it held an episode answers a lost-host
        failure until it is reset (its env is gone, whichever call found the worker dead)."""
        results: dict[int, Any] = {}
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for slot, arg in items:
            if cmd == "reset":
                self._lost.discard(slot)
            elif slot in self._lost:
                results[slot] = WorkerFailure(f"env worker {self.worker_of(slot)} was "
                                              "replaced; this env's episode went with it",
                                              lost=True)
                continue
            by_worker.setdefault(self.worker_of(slot), []).append((slot // self.num_workers, arg))
        sent = [w for w, local in by_worker.items() if self._send(w, cmd, local)]
        deadline = time.monotonic() + self.timeout_s
        for w, local in by_worker.items():
            # a new host's first answer also holds its start-up (imports, the env's build)
            left = max(0.0, deadline - time.monotonic()) + \
                (STARTUP_GRACE_S if w in self._fresh else 0.0)
            answers = self._receive(w, left) if w in sent else None
            if answers is None:
                self._restart(w)
                self._lost |= {s for s in range(w, self.num_envs, self.num_workers)} - \
                    {i * self.num_workers + w for i, _ in local}
                for i, _ in local:
                    results[i * self.num_workers + w] = WorkerFailure(
                        f"env worker {w} died or stopped answering; restarted", lost=True)
                continue
            self._fresh.discard(w)
            if cmd == "reset":
                self._resets[w] += len(local)
            for i, answer in answers:
                results[i * self.num_workers + w] = answer
        return results

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EnvPool(HostPool):
    """``num_envs`` environment slots in ``num_workers`` processes (spawned), each
    answering its pipe (:func:`serve_pipe`)."""

    def __init__(self, env_id: str, env_kwargs: dict | None = None, num_envs: int = 1,
                 num_workers: int = 1, recycle_after: int | None = None,
                 timeout_s: float = 600.0) -> None:
        super().__init__(num_envs, num_workers, recycle_after, timeout_s)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = [None] * self.num_workers
        self._conns: list[Any] = [None] * self.num_workers
        for w in range(self.num_workers):
            self._start(w)
        self._fresh = set(range(self.num_workers))

    def _start(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, self.env_id, self.env_kwargs),
                                 daemon=True)
        proc.start()
        child.close()
        self._procs[w], self._conns[w] = proc, parent

    def _stop(self, w: int) -> None:
        proc = self._procs[w]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(timeout=10)

    def _send(self, w: int, cmd: str, items: list[tuple[int, Any]]) -> bool:
        try:
            self._conns[w].send((cmd, items))
            return True
        except (BrokenPipeError, OSError):
            return False

    def _receive(self, w: int, timeout_s: float):
        conn = self._conns[w]
        try:
            if not conn.poll(timeout_s):
                return None
            return conn.recv()
        except (EOFError, OSError):
            return None

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

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
