"""Where the collector's env slots live, behind one interface (:class:`EnvSlots`), and the
one place a backend is chosen (:func:`make_pool`):

- ``env.workers: 0``: :class:`LocalPool`, the envs in this process (no worker process
  to start or lose: for debugging, for tests, and for envs too light to be worth one);
- ``env.workers: N`` (N >= 1): :class:`~gaca_agent.collect.workers.EnvPool`, the envs in
  N spawned worker processes, restarted when they die or stall;
- ``env.servers: [URL, ...]``: :class:`~gaca_agent.collect.remote_pool.RemotePool`, the
  envs on ``gaca-env-serve`` servers;
- ``cluster.backend: ray``: :class:`~gaca_agent.cluster.ray_pool.RayPool`, the envs in Ray
  actors placed over a cluster's nodes.

Every backend plays the same env code (:class:`~gaca_agent.collect.workers.EnvHost`
locally and in each worker; the served env on a server), so an episode plays the same
way on any of them.
"""

from __future__ import annotations

from typing import Any, Protocol

from gaca_agent.collect.settings import EnvSpec, HostSettings
from gaca_agent.collect.workers import EnvHost, EnvPool


class EnvSlots(Protocol):
    """``num_envs`` env slots spread over ``num_workers`` hosts (processes, servers)."""

    num_envs: int
    num_workers: int
    restarts: int
    """Hosts lost and replaced (or sessions lost to a failing server)."""
    recycles: int
    """Hosts replaced on purpose (``recycle_after``)."""
    expert: bool
    """Whether the envs are asked for expert actions (env servers send them only then)."""

    def worker_of(self, slot: int) -> int: ...

    def draining(self, slot: int) -> bool:
        """Whether no new episode should start on ``slot`` now."""

    def recycle_idle(self, busy_workers: set[int]) -> int:
        """Replace (or bring back) the hosts due for it that hold no live episode."""

    def call(self, cmd: str, items: list[tuple[int, Any]]) -> dict[int, Any]:
        """``cmd`` for (slot, argument) pairs: slot -> answer or ``WorkerFailure``."""

    def pids(self) -> list[int]: ...

    def close(self) -> None: ...


class LocalPool:
    """``num_envs`` env slots in this process (one :class:`EnvHost`)."""

    num_workers = 1
    restarts = 0
    recycles = 0

    def __init__(self, env_id: str, env_kwargs: dict | None = None, num_envs: int = 1) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self.num_envs, self.expert = num_envs, False
        self.host = EnvHost(env_id, env_kwargs)

    def worker_of(self, slot: int) -> int:
        return 0

    def draining(self, slot: int) -> bool:
        return False

    def recycle_idle(self, busy_workers: set[int]) -> int:
        return 0

    def call(self, cmd: str, items: list[tuple[int, Any]]) -> dict[int, Any]:
        return dict(self.host.handle(cmd, items))

    def pids(self) -> list[int]:
        import os

        return [os.getpid()]

    def close(self) -> None:
        self.host.close()

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_pool(spec: EnvSpec, hosts: HostSettings, token: str | None = None) -> EnvSlots:
    """The env slots of ``spec`` where ``hosts`` says: on its servers, in this process
    (``workers: 0``) or in worker processes. (Ray actors are the cluster's:
    :func:`gaca_agent.cluster.ray_pool.ray_pool`, handed to the collector by the trainer.)"""
    if hosts.servers:
        from gaca_agent.collect.remote_pool import RemotePool

        return RemotePool(list(hosts.servers), spec.id, spec.kwargs, hosts.max_live_envs,
                          hosts.timeout_s, token)
    if hosts.workers == 0:
        return LocalPool(spec.id, spec.kwargs, hosts.max_live_envs)
    return EnvPool(spec.id, spec.kwargs, hosts.max_live_envs, hosts.workers,
                   hosts.recycle_after, hosts.timeout_s)
