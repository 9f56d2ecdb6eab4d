"""Env workers as Ray actors: :class:`RayPool` is the collector's env-slot backend for
``cluster.backend: ray``.

Each actor is an :class:`EnvActor`, the :class:`~gaca_agent.collect.workers.EnvHost` a
local worker process runs (several env slots each), asking the cluster for
``cluster.env_cpus``, ``env_memory_mb`` and ``env_resources`` and spread over the nodes
(Ray's ``SPREAD`` strategy). Slot routing, restarts and recycling are
:class:`~gaca_agent.collect.workers.HostPool`'s: an actor that dies, or whose node is
lost, or that does not answer within ``env.timeout_s``, is replaced by a new one wherever
the cluster has room, and its slots answer a lost-host failure, which the collector
replays from the episode's seed (``env.rerun_lost``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gaca_agent.cluster.fit import (actors_per_collector, fit_problem, node_resources,
                                    placement, plan_problem)
from gaca_agent.collect.workers import EnvHost, HostPool


class EnvActor(EnvHost):
    """An :class:`EnvHost` that can say which node it runs on."""

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


ADDRESS_VAR = "GACA_RAY_ADDRESS"
"""The Ray cluster a learner rank Ray placed joins (set by its actor)."""


def connect(cluster, log_to_driver: bool = False) -> None:
    """Join ``cluster.address`` (a learner rank Ray placed: its launcher's cluster) or
    start a Ray on this machine, on loopback (once per process); ``log_to_driver``: the
    output of the actors this process starts shows in its own."""
    import os

    import ray

    if ray.is_initialized():
        return
    address = cluster.address or os.environ.get(ADDRESS_VAR, "")
    if address:
        check_reachable(address)  # ray.init waits forever for an address nothing holds
        host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
        with on_loopback(host in LOOPBACK):  # a Ray started on loopback by another process
            ray.init(address=address, log_to_driver=log_to_driver)
    else:
        with on_loopback(True):
            ray.init(address="local", object_store_memory=cluster.object_store_mb << 20,
                     include_dashboard=False, log_to_driver=log_to_driver)


#: The hosts a Ray on loopback is joined by.
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@contextlib.contextmanager
def on_loopback(wanted: bool):
    """Inside, a Ray made or joined here stays on loopback (when ``wanted``): its services
    listen on 127.0.0.1, not on the default route's address where any host of the network
    could reach them, and a loopback address is not rewritten to that address. Ray keeps
    loopback where it runs without cluster support; its flag is read when a node is made
    or joined, and is restored after."""
    from ray._private import ray_constants

    if not wanted:
        yield
        return
    cluster_mode, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_mode


def check_placement(cluster, env_workers: int) -> str | None:
    """Join (or start) the run's Ray and say in one line why the run's whole placement
    (:func:`~gaca_agent.cluster.fit.placement`) cannot fit its nodes; None when it can."""
    connect(cluster, log_to_driver=bool(cluster.learners))  # the ranks' output shows here
    return plan_problem(placement(cluster, env_workers), node_resources())


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address must accept a TCP connection within
    ``timeout_s``: else one ConnectionError naming it (``auto`` is Ray's own lookup)."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConnectionError(f"cluster.address {address!r} is not HOST:PORT, "
                              "ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConnectionError(f"cluster.address {address}: no Ray answers there within "
                              f"{timeout_s:g} s ({err}); start it with ray start --head, "
                              "or leave cluster.address empty to start one here") from None


def actor_options(cpus: float, resources: dict, memory_mb: int = 0) -> dict[str, Any]:
    """Ray options of an actor that asks for ``cpus``, ``resources`` and ``memory_mb``,
    spread over the nodes and never restarted by Ray (its pool or fleet replaces it)."""
    options: dict[str, Any] = {"num_cpus": cpus, "scheduling_strategy": "SPREAD",
                               "max_restarts": 0}
    if memory_mb:
        options["memory"] = memory_mb << 20
    if resources:
        options["resources"] = {k: float(v) for k, v in resources.items()}
    return options


class RayPool(HostPool):
    """``num_envs`` env slots in ``num_workers`` Ray actors (see the module docstring)."""

    def __init__(self, env_id: str, env_kwargs: dict | None, num_envs: int, num_workers: int,
                 cluster, recycle_after: int | None = None, timeout_s: float = 600.0) -> None:
        import ray

        super().__init__(num_envs, num_workers, recycle_after, timeout_s)
        connect(cluster)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        options = actor_options(cluster.env_cpus, cluster.env_resources, cluster.env_memory_mb)
        ask = {"CPU": cluster.env_cpus, "memory": float(options.get("memory", 0)),
               **options.get("resources", {})}
        problem = fit_problem([ask] * self.num_workers, node_resources(),
                              f"{self.num_workers} env actors")
        if problem:  # at once: waiting for room would end only after timeout_s
            raise RuntimeError(f"cannot place {problem} (lower cluster.env_cpus or "
                               "env.workers, or add nodes)")
        self._actor_cls = ray.remote(EnvActor).options(**options)
        self._actors: list[Any] = [None] * self.num_workers
        self._pending: dict[int, Any] = {}
        for w in range(self.num_workers):
            self._start(w)
        _, waiting = ray.wait([a.node.remote() for a in self._actors],
                              num_returns=self.num_workers, timeout=timeout_s)
        if waiting:
            self.close()
            raise RuntimeError(
                f"{len(waiting)} of {self.num_workers} env actors asking for "
                f"{cluster.env_cpus:g} CPU, {cluster.env_memory_mb} MB and "
                f"{dict(cluster.env_resources)} each were not "
                f"placed within {timeout_s:g} s: the cluster has {ray.available_resources()} "
                f"free (lower cluster.env_cpus or env.workers, or add nodes)")

    def _start(self, w: int) -> None:
        self._actors[w] = self._actor_cls.remote(self.env_id, self.env_kwargs)

    def _stop(self, w: int) -> None:
        import ray

        self._pending.pop(w, None)
        try:
            ray.kill(self._actors[w], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass

    def _send(self, w: int, cmd: str, items: list[tuple[int, Any]]) -> bool:
        self._pending[w] = self._actors[w].handle.remote(cmd, items)
        return True

    def _receive(self, w: int, timeout_s: float):
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        try:
            return ray.get(self._pending.pop(w), timeout=timeout_s)
        except (RayError, GetTimeoutError):
            return None  # the actor died, its node was lost, or it did not answer in time

    def _each(self, method: str, *args) -> list[Any]:
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self._actors],
                       timeout=self.timeout_s)

    def pids(self) -> list[int]:
        return [answers[0][1] for answers in self._each("handle", "pid", [(0, None)])]

    def nodes(self) -> list[str]:
        """The node id of each actor's node."""
        return self._each("node")

    def close(self) -> None:
        import ray

        for w, actor in enumerate(self._actors):
            if actor is None:
                continue
            try:
                ray.get(actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - gone already
                pass
            self._stop(w)
            self._actors[w] = None


def ray_pool(spec, hosts, cluster):
    """The collector's pool factory for ``cluster.backend: ray``: a :class:`RayPool` of
    the env ``spec`` sized by ``hosts`` (:mod:`gaca_agent.collect.settings`), made when the
    collector first needs it."""
    return lambda: RayPool(spec.id, spec.kwargs, hosts.max_live_envs,
                           actors_per_collector(cluster, hosts.workers), cluster,
                           hosts.recycle_after, hosts.timeout_s)
