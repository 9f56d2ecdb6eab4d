"""GRAFT (arXiv 2609.28963; reconstruction): values on the group's merged state graph.

The task group's trajectories are merged into one graph keyed by canonical state; node
values come from Bellman iteration with the empirical transition frequencies,
V(s) = mean over outgoing transitions of [r + gamma V(s')], and each step gets the
graph TD error, optionally accumulated Graph-GAE style: A_t = sum_h (gamma lam)^h delta_t+h.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gaca_agent.advantages.batch import Prepared
from gaca_agent.advantages.common import check_gamma, diagnostics
from gaca_agent.advantages.registry import register
from gaca_agent.advantages.stats import discounted_reverse_cumsum, factorize, segment_count


@dataclass(frozen=True)
class GRAFTConfig:
    """GRAFT's options (reconstruction defaults, not the paper's values)."""

    gamma: float = 0.99
    lam: float = 0.95
    """Graph-GAE lambda (docs/algorithms.md's ``lambda``); 0 gives the one-step TD error."""
    max_iters: int = 20_000
    tol: float = 1e-9
    """Stop when the error bound max|V_k+1 - V_k| * gamma / (1 - gamma) is below this."""

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lambda must be in [0, 1], got {self.lam}")
        if self.max_iters < 1:
            raise ValueError("max_iters must be >= 1")


def graph_values(node: np.ndarray, next_node: np.ndarray, reward: np.ndarray,
                 terminal: np.ndarray, gamma: float, max_iters: int, tol: float) -> np.ndarray:
    """Bellman iteration over transitions (rows); nodes without outgoing rows have V = 0."""
    k = int(max(node.max(), next_node.max())) + 1
    out = segment_count(node, k)
    V = np.zeros(k)
    cont = gamma * (~terminal)
    for _ in range(max_iters):  # a loop over iterations, each one vectorised over rows
        target = reward + cont * V[next_node]
        new = np.divide(np.bincount(node, weights=target, minlength=k), out,
                        out=np.zeros(k), where=out > 0)
        change = np.max(np.abs(new - V))
        if change == 0 or (gamma < 1 and change * gamma / (1 - gamma) < tol):
            return new
        V = new
    return V


@register("graft", GRAFTConfig)
def graft(p: Prepared, cfg: GRAFTConfig):
    if p.n == 0:
        return np.zeros(0), diagnostics(p)
    next_state = p.field("next_state", "graft")
    terminal = (p.field("terminal", "graft").astype(bool) if p.batch.terminal is not None
                else np.zeros(p.n, bool))
    codes = factorize(np.concatenate([np.asarray(p.state), next_state]))
    width = int(codes.max()) + 1
    nodes = factorize(np.concatenate([p.group * width + codes[: p.n],
                                      p.group * width + codes[p.n:]]))
    node, next_node = nodes[: p.n], nodes[p.n:]
    V = graph_values(node, next_node, p.reward, terminal, cfg.gamma, cfg.max_iters, cfg.tol)
    delta = p.reward + cfg.gamma * (~terminal) * V[next_node] - V[node]
    adv = discounted_reverse_cumsum(delta, p.traj, p.t, cfg.gamma * cfg.lam)
    return adv, diagnostics(p)
