"""Env slots on env servers (``gaca-env-serve``) instead of local worker processes.

:class:`RemotePool` is one of the collector's env-slot backends
(:class:`~gaca_agent.collect.pools.EnvSlots`), so the collector plays the same way on any. Slot j is a ``gaca/Remote-v0`` session on server
``j % len(servers)``; each command goes to every slot concurrently (one thread per slot
with work) and the slots' sessions step in parallel on their servers.

A server that fails a command (it died, timed out or refused) answers
:class:`~gaca_agent.collect.workers.WorkerFailure` for that slot, so the collector marks
the episode failed (kept, never dropped), and is marked down: its slots start no new
episode (:meth:`draining`) until a health check succeeds, retried with exponential
back-off (1, 2, 4 ... 60 s). If every server stays down for ``timeout_s``, collection
stops with an error naming them.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gaca_agent.collect.workers import WorkerFailure

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)


class RemotePool:
    """``num_envs`` env slots spread over ``servers`` (URLs of ``gaca-env-serve``)."""

    def __init__(self, servers: list[str], env_id: str, env_kwargs: dict | None = None,
                 num_envs: int = 1, timeout_s: float = 600.0, token: str | None = None,
                 expert: bool = False) -> None:
        if not servers:
            raise ValueError("env servers: give at least one URL")
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self.servers = [s.rstrip("/") for s in servers]
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.num_envs, self.num_workers = num_envs, len(self.servers)
        self.timeout_s, self.token, self.expert = timeout_s, token, expert
        self._envs: list[Any] = [None] * num_envs
        self._down_since: dict[int, float] = {}
        self._retry_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._threads = ThreadPoolExecutor(max_workers=min(num_envs, 64))
        self.restarts = 0  # sessions lost to a failing server
        self.recycles = 0
        self._check_served_env()

    # -------------------------------------------------------------- EnvPool API
    def worker_of(self, slot: int) -> int:
        return slot % self.num_workers

    def pids(self) -> list[int]:
        return []

    def draining(self, slot: int) -> bool:
        """Whether the server of ``slot`` is down (start nothing there now)."""
        return self.worker_of(slot) in self._down_since

    def recycle_idle(self, busy_workers: set[int]) -> int:
        """Health-check the down servers whose back-off has passed; returns how many came
        back. Waits (bounded) when every server is down, and raises after ``timeout_s``."""
        now = time.monotonic()
        back = 0
        for w in sorted(self._down_since):
            if now >= self._retry_at[w]:
                if self._healthy(w):
                    del self._down_since[w], self._retry_at[w]
                    self._failures.pop(w, None)
                    back += 1
                else:
                    self._schedule_retry(w)
        if len(self._down_since) == self.num_workers and not busy_workers:
            oldest = min(self._down_since.values())
            if time.monotonic() - oldest > self.timeout_s:
                raise RuntimeError(f"every env server has been down for over "
                                   f"{self.timeout_s:.0f} s: {self.servers}")
            time.sleep(max(0.0, min(self._retry_at.values()) - time.monotonic()))
        return back

    def call(self, cmd: str, items: list[tuple[int, Any]]) -> dict[int, Any]:
        """Run ``cmd`` for (slot, argument) pairs; returns slot -> answer or WorkerFailure."""
        futures = {slot: self._threads.submit(self._one, cmd, slot, arg) for slot, arg in items}
        return {slot: f.result() for slot, f in futures.items()}

    def close(self) -> None:
        for slot, env in enumerate(self._envs):
            if env is not None:
                env.close()
                self._envs[slot] = None
        self._threads.shutdown(wait=True)

    def __enter__(self) -> "RemotePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- internals
    def _env(self, slot: int):
        if self._envs[slot] is not None:
            self._envs[slot].expert = self.expert
        else:
            from gaca_envs.remote.client import RemoteEnv

            self._envs[slot] = RemoteEnv(self.servers[self.worker_of(slot)], self.env_kwargs,
                                         token=self.token, timeout_s=self.timeout_s,
                                         expert=self.expert)
        return self._envs[slot]

    def _one(self, cmd: str, slot: int, arg: Any) -> Any:
        from gaca_envs.remote.client import RemoteEnvError, RemoteEnvLost

        try:
            env = self._env(slot)
            if cmd == "reset":
                return env.reset(seed=arg[0], options=arg[1])
            if cmd == "step":
                return env.step(arg)
            if cmd == "expert":
                return env.expert_action()
            raise ValueError(f"unknown env command {cmd!r}")
        except RemoteEnvError as err:
            w = self.worker_of(slot)
            if isinstance(err, RemoteEnvLost):
                self._envs[slot] = None
                self.restarts += 1
                if w not in self._down_since:
                    self._down_since[w] = time.monotonic()
                    self._schedule_retry(w)
            return WorkerFailure(f"env server {self.servers[w]}: {err}",
                                 lost=isinstance(err, RemoteEnvLost))
        except Exception as err:  # noqa: BLE001 - reported per slot, like a local worker
            return WorkerFailure(f"{type(err).__name__}: {err}")

    def _schedule_retry(self, w: int) -> None:
        n = self._failures.get(w, 0)
        self._failures[w] = n + 1
        self._retry_at[w] = time.monotonic() + BACKOFF_S[min(n, len(BACKOFF_S) - 1)]

    def _get(self, url: str, timeout_s: float) -> dict[str, Any]:
        """GET a server's JSON answer (with the token); raises OSError when unreachable."""
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def _healthy(self, w: int) -> bool:
        try:
            self._get(self.servers[w] + "/health", 5)
            return True
        except (OSError, ValueError):
            return False

    def _check_served_env(self) -> None:
        """Every server must serve ``env_id`` (its /metadata name); fail fast otherwise."""
        for url in self.servers:
            try:
                name = self._get(url + "/metadata", 30).get("name")
            except OSError as err:
                raise RuntimeError(f"env server {url} cannot be reached: {err}") from err
            if name != self.env_id:
                raise ValueError(f"env server {url} serves {name!r}, not {self.env_id!r}")
