"""GACA's claim 3 on the diagnostic worlds: does a step's NLL track how much the action
matters there?

    python benchmarks/bench_claim3.py --seeds 30 [--json out.json]

Per world and behaviour policy, 30 seeds of 16 tasks x 8 rollouts; for every step row:
its NLL -log pi(a|s), the exact local action-value spread at its state (max_a Q(s, a) -
min_a Q(s, a), Q of the behaviour policy) and the variance of Q(s, .) under pi(.|s).
Pearson and Spearman correlations of the NLL with both, and the mean NLL and spread at
pivotal steps (the optimal Q-gap at least half the task's largest) against routine ones.

Policies: ``warm`` (bench_credit's ``aligned`` softmax at T = 1: uncertain at pivotal
states *by construction*, a check of the measurement, not of the claim);
``unrelated`` (its ``random`` structure: confidence drawn regardless of the state);
``trained-3`` and ``trained-10`` (natural policy gradient from the uniform policy,
preferences += A(s, a) for 3 or 10 exact updates: the uncertainty that learning leaves,
which nothing here builds in).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_credit import GAMMA, behaviour  # noqa: E402

from gaca_agent.analysis.rescore import average_ranks  # noqa: E402
from gaca_envs.diag import exact_values, optimal_policy, simulate, softmax_policy  # noqa: E402
from gaca_envs.diag.env import build_world  # noqa: E402
from gaca_envs.diag.worlds import WORLDS  # noqa: E402

POLICIES = ("warm", "unrelated", "trained-3", "trained-10")


def policy_of(mdp, kind: str, rng):
    if kind == "warm":
        return behaviour(mdp, "aligned", 1.0, rng)
    if kind == "unrelated":
        return behaviour(mdp, "random", 1.0, rng)
    prefs = [np.zeros(len(a)) for a in mdp.actions]
    for _ in range(int(kind.split("-")[1])):
        adv = exact_values(mdp, softmax_policy(prefs, 1.0), GAMMA).A
        prefs = [p + a for p, a in zip(prefs, adv)]
    return softmax_policy(prefs, 1.0)


def rows(world: str, kind: str, rng) -> dict[str, list]:
    mdps = (build_world(world, int(task)) for task in rng.choice(64, size=16, replace=False))
    return rows_from(((mdp, policy_of(mdp, kind, rng)) for mdp in mdps), rng)


def rows_from(tasks, rng) -> dict[str, list]:
    """Per step of 8 rollouts of each (mdp, tabular policy) of ``tasks``: the NLL, the
    exact Q-spread and Var_pi Q at its state, and whether the state is pivotal."""
    out = {"nll": [], "spread": [], "var": [], "pivotal": []}
    for mdp, pi in tasks:
        q = exact_values(mdp, pi, GAMMA).Q
        q_star = exact_values(mdp, optimal_policy(mdp, GAMMA), GAMMA).Q
        gap = np.array([x.max() - x.min() for x in q_star])
        pivotal = gap >= 0.5 * gap.max() if gap.max() > 0 else np.zeros(len(gap), bool)
        for _ in range(8):
            for st in simulate(mdp, pi, rng, 40):
                s = st.state
                v = float(pi[s] @ q[s])
                out["nll"].append(-np.log(pi[s][st.action]))
                out["spread"].append(float(q[s].max() - q[s].min()))
                out["var"].append(float(pi[s] @ (q[s] - v) ** 2))
                out["pivotal"].append(bool(pivotal[s]))
    return out


def corr(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else 0.0


def cell(world: str, kind: str, seeds: int) -> dict:
    per = [measures(rows(world, kind, np.random.default_rng([seed, len(world), len(kind), 3])))
           for seed in range(seeds)]
    return {"world": world, "policy": kind, **summarise(per)}


def measures(r: dict[str, list]) -> dict[str, float]:
    """The correlations and pivotal/routine means of one seed's rows."""
    piv = np.asarray(r["pivotal"])
    nll, spread = np.asarray(r["nll"]), np.asarray(r["spread"])
    return {
        "pearson_spread": corr(nll, spread), "pearson_var": corr(nll, r["var"]),
        "spearman_spread": corr(average_ranks(nll), average_ranks(spread)),
        "nll_pivotal": float(nll[piv].mean()) if piv.any() else float("nan"),
        "nll_routine": float(nll[~piv].mean()) if (~piv).any() else float("nan"),
        "spread_pivotal": float(spread[piv].mean()) if piv.any() else float("nan"),
        "spread_routine": float(spread[~piv].mean()) if (~piv).any() else float("nan")}


def summarise(per: list[dict[str, float]]) -> dict[str, float | None]:
    """Each measure's mean over seeds and its 95% normal interval (NaNs left out)."""
    out: dict[str, float | None] = {}
    for k in per[0]:
        v = np.asarray([p[k] for p in per])
        v = v[np.isfinite(v)]
        out[k] = float(v.mean()) if len(v) else None
        out[k + "_ci"] = float(1.96 * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    out = []
    print("| world | policy | corr(NLL, spread) | Spearman | corr(NLL, Var_pi Q) | NLL pivotal / "
          "routine | spread pivotal / routine |")
    print("|---|---|---|---|---|---|---|")
    f = (lambda x: "–" if x is None else f"{x:.3f}")
    for world in sorted(WORLDS):
        for kind in POLICIES:
            c = cell(world, kind, args.seeds)
            out.append(c)
            print(f"| {world} | {kind} | {f(c['pearson_spread'])} ± {f(c['pearson_spread_ci'])} | "
                  f"{f(c['spearman_spread'])} | {f(c['pearson_var'])} | {f(c['nll_pivotal'])} / "
                  f"{f(c['nll_routine'])} | {f(c['spread_pivotal'])} / {f(c['spread_routine'])} |",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
