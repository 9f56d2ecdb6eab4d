"""Whether a set of Ray resource requests can ever be placed on a cluster's nodes: a
request that no node holds, or requests that add up to more than all nodes hold, are
found before anything starts (waiting for them would only end at a timeout)."""

from __future__ import annotations

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
