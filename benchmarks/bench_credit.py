"""Credit quality: how close each estimator's advantages are to the exact ones.

On the diagnostic worlds the true advantage A(s, a) = Q(s, a) - V(s) of the behaviour
policy is known exactly (``gaca_envs.diag.exact_values``). For each setting we sample
16 tasks x 8 rollouts from a tabular softmax behaviour policy, run every estimator on the
step rows (NLL of a step = -log pi(a|s)), and score it against the exact advantage of the
row's (state, action):

- ``corr``: Pearson correlation with the exact advantage (default ``norm="std"``);
- ``mse``: mean squared error in reward units (estimators run with ``norm="mean"`` where
  they have the option, so that scales are comparable).

Behaviour policies: preferences 2 x one-hot(optimal action) + N(0, 1) noise, scaled per
state by a confidence c_s, then a softmax at temperature T. ``aligned``: c_s is low (0.5)
at pivotal states (large optimal-Q gap) and high (3.0) at routine ones, so the policy is
uncertain exactly where decisions matter (GACA's premise). ``random``: c_s drawn from
{0.5, 3.0} regardless of the state, so confidence is unrelated to criticality.
``shuffled``: as ``random``, then the NLLs are permuted across rows: a control in which
the NLL carries no information, so any GACA gain there would be an artefact.

    python benchmarks/bench_credit.py --seeds 30 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np

from gaca_agent.advantages import StepBatch, compute, make_config
from gaca_envs.diag import exact_values, optimal_policy, simulate, softmax_policy
from gaca_envs.diag.env import build_world

GAMMA = 0.95
GROUPS, GROUP_SIZE, MAX_STEPS = 16, 8, 40
CONFIGS: list[tuple[str, dict]] = [
    ("grpo", {}), ("rloo", {}), ("reinforce_pp", {}),
    *[("gigpo", {"omega": w}) for w in (0.25, 0.5, 1.0, 2.0, 4.0)],
    *[("gaca", {"form": f, "kappa": k}) for f in ("linear", "sigmoid", "convex")
      for k in (0.1, 0.25, 0.5, 1.0, 2.0)],
    ("adastep", {}), ("pgpo", {}), ("graft", {"gamma": GAMMA, "lam": 0.95}), ("empg", {}),
]


def label(name: str, params: dict) -> str:
    return name + ("(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


def behaviour(mdp, structure: str, temperature: float, rng) -> list[np.ndarray]:
    opt = optimal_policy(mdp, GAMMA)
    q_star = exact_values(mdp, opt, GAMMA).Q
    gap = np.array([q.max() - q.min() for q in q_star])
    pivotal = gap >= 0.5 * gap.max()
    prefs = []
    for s, o in enumerate(opt):
        conf = (0.5 if pivotal[s] else 3.0) if structure == "aligned" else rng.choice([0.5, 3.0])
        prefs.append(conf * (2.0 * o + rng.normal(size=len(o))))
    return softmax_policy(prefs, temperature)


def sample_batch(world: str, structure: str, temperature: float, rng):
    cols = defaultdict(list)
    exact = []
    traj = 0
    for g, task in enumerate(rng.choice(64, size=GROUPS, replace=False)):
        mdp = build_world(world, int(task))
        policy = behaviour(mdp, structure, temperature, rng)
        adv = exact_values(mdp, policy, GAMMA).A
        for _ in range(GROUP_SIZE):
            for t, st in enumerate(simulate(mdp, policy, rng, MAX_STEPS)):
                for key, value in (("group", g), ("traj", traj), ("t", t), ("reward", st.reward),
                                   ("state", g * 1000 + st.state),
                                   ("next_state", g * 1000 + st.next_state),
                                   ("action", st.action), ("terminal", st.terminal),
                                   ("nll", -np.log(policy[st.state][st.action]))):
                    cols[key].append(value)
                exact.append(adv[st.state][st.action])
            traj += 1
    if structure == "shuffled":
        cols["nll"] = list(rng.permutation(cols["nll"]))
    return StepBatch(**{k: np.asarray(v) for k, v in cols.items()}), np.asarray(exact)


def score(name: str, params: dict, batch: StepBatch, exact: np.ndarray) -> tuple[float, float]:
    adv, _ = compute(name, batch, **params)
    corr = float(np.corrcoef(adv, exact)[0, 1]) if adv.std() > 0 else 0.0
    fields = make_config(name, **params).__dataclass_fields__
    mean_adv = compute(name, batch, **params, **({"norm": "mean"} if "norm" in fields else {}))[0]
    return corr, float(np.mean((mean_adv - exact) ** 2))


def run(seeds: int) -> list[dict]:
    results = []
    for world in ("corridor", "slippery"):
        for structure in ("aligned", "random", "shuffled"):
            for temperature in (0.5, 1.0, 2.0):
                per = defaultdict(lambda: ([], []))
                for seed in range(seeds):
                    rng = np.random.default_rng([seed, int(temperature * 10), len(world),
                                                 len(structure)])
                    batch, exact = sample_batch(world, structure, temperature, rng)
                    for name, params in CONFIGS:
                        c, m = score(name, params, batch, exact)
                        per[label(name, params)][0].append(c)
                        per[label(name, params)][1].append(m)
                for key, (corrs, mses) in per.items():
                    corrs = np.asarray(corrs)
                    results.append({"world": world, "structure": structure, "T": temperature,
                                    "estimator": key, "corr": float(corrs.mean()),
                                    "corr_ci": float(1.96 * corrs.std(ddof=1) / np.sqrt(seeds)),
                                    "mse": float(np.mean(mses))})
                print(f"done {world} {structure} T={temperature}", file=sys.stderr, flush=True)
    return results


def table(results: list[dict]) -> str:
    by = defaultdict(dict)
    for r in results:
        by[(r["world"], r["structure"], r["T"])][r["estimator"]] = r
    lines = ["| world | NLL structure | T | GRPO | best GiGPO (omega) | GACA linear k=0.25 | "
             "best GACA | AdaStep | PGPO | GRAFT | EMPG | GACA - best GiGPO | "
             "MSE GiGPO(1) / GACA |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (world, structure, T), rows in by.items():
        def cell(key):
            return f"{rows[key]['corr']:.3f} ± {rows[key]['corr_ci']:.3f}"
        gig = max((k for k in rows if k.startswith("gigpo")), key=lambda k: rows[k]["corr"])
        gac = max((k for k in rows if k.startswith("gaca")), key=lambda k: rows[k]["corr"])
        diff = rows[gac]["corr"] - rows[gig]["corr"]
        lines.append(
            f"| {world} | {structure} | {T} | {cell('grpo')} | {cell(gig)} "
            f"({gig.split('=')[1].rstrip(')')}) | {cell('gaca(form=linear,kappa=0.25)')} | "
            f"{cell(gac)} ({gac[5:-1]}) | {cell('adastep')} | {cell('pgpo')} | "
            f"{cell('graft(gamma=0.95,lam=0.95)')} | {cell('empg')} | {diff:+.3f} | "
            f"{rows['gigpo(omega=1.0)']['mse']:.3f} / "
            f"{rows['gaca(form=linear,kappa=0.25)']['mse']:.3f} |")
    return "\n".join(lines)


def seeds_main(doc: str, run_fn, table_fn, argv=None) -> int:
    """``--seeds N [--json out.json]``: run, print the table, keep the numbers."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results = run_fn(args.seeds)
    print(table_fn(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main(argv=None) -> int:
    return seeds_main(__doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
