"""Placement as data: what a Ray run places (:func:`placement`: env actors, inference
servers, learner ranks, each with what it asks of a node), and whether it can ever be
placed on a cluster's nodes: a request that no node holds, or requests that add up to
more than all nodes hold, are found before anything starts (waiting for them would only
end at a timeout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def fit_problem(requests: Sequence[dict[str, float]], nodes: Sequence[dict[str, float]],
                what: str) -> str | None:
    """One line saying why ``requests`` (each an actor's or bundle's resources) cannot
    be placed on ``nodes`` (each node's total resources), or None when they might be:
    a request larger than every node, or a resource whose requests exceed the cluster's
    total. ``what`` names the requests in the line."""
    for request in requests:
        needed = {k: v for k, v in request.items() if v > 0}
        if needed and not any(all(node.get(k, 0.0) >= v for k, v in needed.items())
                              for node in nodes):
            return (f"{what}: no node has {needed} (the nodes have "
                    f"{[_shown(n, needed) for n in nodes]})")
    totals: dict[str, float] = {}
    for request in requests:
        for k, v in request.items():
            totals[k] = totals.get(k, 0.0) + v
    for k, v in sorted(totals.items()):
        held = sum(node.get(k, 0.0) for node in nodes)
        if v > held:
            return (f"{what}: {len(requests)} of them ask for {v:g} {k} in all; the "
                    f"cluster has {held:g}")
    return None


def _shown(node: dict[str, float], keys) -> dict[str, float]:
    return {k: node.get(k, 0.0) for k in keys}


def node_resources() -> list[dict[str, float]]:
    """Each live node's total resources (Ray connected)."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


@dataclass(frozen=True)
class Role:
    """One kind of actor a run places: how many, and what each asks of a node."""

    name: str
    count: int
    resources: dict[str, float]

    def line(self) -> str:
        asked = ", ".join(f"{k} {v:g}" for k, v in self.resources.items() if v > 0) or "nothing"
        return f"{self.count} {self.name}, each {asked}"


def actors_per_collector(cluster, env_workers: int) -> int:
    """Env actors of one collector: ``cluster.env_actors``, else ``env.workers`` (>= 1)."""
    return cluster.env_actors or max(env_workers, 1)


def placement(cluster, env_workers: int) -> list[Role]:
    """What ``cluster.backend: ray`` places, from gaca-train's cluster section and
    ``env.workers``: env actors (always: each learner process has two collectors, the
    training and the held-out one, each with its own actors), inference servers and
    learner ranks (when asked for)."""
    per_collector = actors_per_collector(cluster, env_workers)
    processes = max(cluster.learners, 1)
    roles = [Role(f"env actors ({per_collector} per collector, 2 collectors per learner "
                  f"process, {processes} process{'es' if processes > 1 else ''})",
                  2 * per_collector * processes,
                  {"CPU": float(cluster.env_cpus),
                   "memory": float(cluster.env_memory_mb << 20),
                   **{k: float(v) for k, v in cluster.env_resources.items()}})]
    if cluster.servers:
        roles.append(Role("inference servers", cluster.servers,
                          {"CPU": float(cluster.server_cpus),
                           **{k: float(v) for k, v in cluster.server_resources.items()}}))
    if cluster.learners:
        roles.append(Role("learner ranks", cluster.learners,
                          {"CPU": float(cluster.learner_cpus),
                           "GPU": float(cluster.learner_gpus),
                           **{k: float(v) for k, v in cluster.learner_resources.items()}}))
    return roles


def plan_problem(roles: Sequence[Role], nodes: Sequence[dict[str, float]]) -> str | None:
    """Why the whole plan cannot be placed on ``nodes`` (one line), or None: each role
    alone, then every role together."""
    for role in roles:
        problem = fit_problem([role.resources] * role.count, nodes, f"{role.count} {role.name}")
        if problem:
            return problem
    return fit_problem([r.resources for r in roles for _ in range(r.count)], nodes,
                       "the plan (" + "; ".join(r.line() for r in roles) + ")")
