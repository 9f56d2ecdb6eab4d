"""Tabular text MDPs with exactly computable values under any tabular policy.

A :class:`TabularMDP` lists its states (with the text an agent observes in each), the
actions available in each state, and for every (state, action) the outcomes
``(probability, next_state, reward, terminal)``. :func:`exact_values` solves the Bellman
equations ``V = r_pi + gamma * P_pi V`` of a policy in closed form, so the true
``Q(s, a)``, ``V(s)`` and advantage ``A(s, a) = Q(s, a) - V(s)`` are known exactly; this is
what estimators are measured against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Outcome:
    """One possible result of taking an action."""

    prob: float
    next_state: int
    reward: float
    terminal: bool


@dataclass(frozen=True)
class TabularMDP:
    """A finite MDP whose states and actions carry text.

    ``actions[s]`` are the action texts of state ``s`` (lower case); ``outcomes[s][a]`` the
    outcomes of action index ``a`` in state ``s`` (probabilities sum to 1). A transition
    with ``terminal=True`` ends the episode; its ``next_state`` is only for display.
    """

    name: str
    task: str
    states: tuple[str, ...]
    observations: tuple[str, ...]
    actions: tuple[tuple[str, ...], ...]
    outcomes: tuple[tuple[tuple[Outcome, ...], ...], ...]
    start: int = 0

    def __post_init__(self) -> None:
        n = len(self.states)
        if not (len(self.observations) == len(self.actions) == len(self.outcomes) == n):
            raise ValueError("states, observations, actions and outcomes differ in length")
        for s in range(n):
            if len(self.actions[s]) != len(self.outcomes[s]):
                raise ValueError(f"state {self.states[s]!r}: actions and outcomes differ")
            for a, outs in enumerate(self.outcomes[s]):
                total = sum(o.prob for o in outs)
                if not outs or abs(total - 1.0) > 1e-9:
                    raise ValueError(f"outcomes of {self.states[s]!r}/{self.actions[s][a]!r}"
                                     f" sum to {total}, not 1")

    @property
    def num_states(self) -> int:
        return len(self.states)


@dataclass(frozen=True)
class Values:
    """Exact values of a policy: ``V[s]``, and ``Q[s][a]``, ``A[s][a]`` per action index."""

    V: np.ndarray
    Q: tuple[np.ndarray, ...]
    A: tuple[np.ndarray, ...]


Policy = Sequence[np.ndarray]  # policy[s][a] = probability of action a in state s


def uniform_policy(mdp: TabularMDP) -> list[np.ndarray]:
    """Every action of a state equally likely."""
    return [np.full(len(acts), 1.0 / len(acts)) for acts in mdp.actions]


def softmax_policy(preferences: Sequence[np.ndarray], temperature: float) -> list[np.ndarray]:
    """``pi(a|s) proportional to exp(pref[s][a] / temperature)``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    out = []
    for pref in preferences:
        z = np.asarray(pref, dtype=float) / temperature
        e = np.exp(z - z.max())
        out.append(e / e.sum())
    return out


def exact_values(mdp: TabularMDP, policy: Policy, gamma: float) -> Values:
    """Solve ``(I - gamma P_pi) V = r_pi`` for the policy's V, then Q and A.

    Needs ``gamma < 1`` or a policy that terminates with probability 1.
    """
    n = mdp.num_states
    if len(policy) != n:
        raise ValueError(f"policy has {len(policy)} states, the MDP {n}")
    P = np.zeros((n, n))
    r = np.zeros(n)
    for s in range(n):
        pi = np.asarray(policy[s], dtype=float)
        if pi.shape != (len(mdp.actions[s]),) or abs(pi.sum() - 1.0) > 1e-8:
            raise ValueError(f"policy of state {mdp.states[s]!r} is not a distribution "
                             f"over its {len(mdp.actions[s])} actions")
        for a, outs in enumerate(mdp.outcomes[s]):
            for o in outs:
                r[s] += pi[a] * o.prob * o.reward
                if not o.terminal:
                    P[s, o.next_state] += pi[a] * o.prob
    V = np.linalg.solve(np.eye(n) - gamma * P, r)
    Q = tuple(_q_from(mdp, V, gamma))
    A = tuple(Q[s] - V[s] for s in range(n))
    return Values(V, Q, A)


def optimal_policy(mdp: TabularMDP, gamma: float = 0.95, iters: int = 10_000,
                   tol: float = 1e-12) -> list[np.ndarray]:
    """A deterministic optimal policy by value iteration (ties go to the first action)."""
    V = np.zeros(mdp.num_states)
    for _ in range(iters):
        Q = _q_from(mdp, V, gamma)
        new = np.array([q.max() for q in Q])
        if np.max(np.abs(new - V)) < tol:
            break
        V = new
    return [np.eye(len(q))[int(np.argmax(q))] for q in _q_from(mdp, V, gamma)]


def _q_from(mdp: TabularMDP, V: np.ndarray, gamma: float) -> list[np.ndarray]:
    return [np.array([sum(o.prob * (o.reward + (0.0 if o.terminal else gamma * V[o.next_state]))
                          for o in outs) for outs in mdp.outcomes[s]])
            for s in range(mdp.num_states)]


@dataclass(frozen=True)
class Step:
    """One simulated transition."""

    state: int
    action: int
    reward: float
    next_state: int
    terminal: bool


def simulate(mdp: TabularMDP, policy: Policy, rng: np.random.Generator,
             max_steps: int) -> list[Step]:
    """One episode from the start state under a tabular policy (truncated at max_steps)."""
    s, steps = mdp.start, []
    for _ in range(max_steps):
        a = int(rng.choice(len(policy[s]), p=policy[s]))
        outs = mdp.outcomes[s][a]
        o = outs[int(rng.choice(len(outs), p=[x.prob for x in outs]))] if len(outs) > 1 else outs[0]
        steps.append(Step(s, a, o.reward, o.next_state, o.terminal))
        if o.terminal:
            break
        s = o.next_state
    return steps
