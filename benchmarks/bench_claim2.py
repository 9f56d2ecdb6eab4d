"""GACA's claim 2 on the diagnostic worlds: the directional alignment against the error.

    python benchmarks/bench_claim2.py --seeds 30 [--json out.json]

The grid, predictions and criterion are in docs/study.md ("Claim 2"), stated before the
first run. Per cell (world x behaviour policy x group size x anchor) and seed: one batch
of 16 tasks x group-size rollouts of a tabular policy, GiGPO's parts (omega 1,
``norm="mean"``), the exact advantages, the alignment alpha = -mean(z u e0), m2 =
mean(z^2 u^2), and GACA's linear-form error at every kappa of the grid.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_credit import GAMMA, behaviour  # noqa: E402

from gaca_agent.advantages import StepBatch, compute  # noqa: E402
from gaca_agent.advantages.gaca import criticality  # noqa: E402
from gaca_agent.analysis.risk import alignment, parts  # noqa: E402
from gaca_envs.diag import exact_values, simulate, softmax_policy  # noqa: E402
from gaca_envs.diag.env import build_world  # noqa: E402
from gaca_envs.diag.worlds import WORLDS  # noqa: E402

KAPPAS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
POLICIES = ("uniform", "warm", "near-optimal")
TASKS, MAX_STEPS, H = 16, 40, 1e-4


def policy_of(mdp, kind: str, rng):
    if kind == "uniform":
        return softmax_policy([np.zeros(len(a)) for a in mdp.actions], 1.0)
    return behaviour(mdp, "aligned", 1.0 if kind == "warm" else 0.25, rng)


def sample(world: str, kind: str, size: int, anchor: str, rng):
    mdps = (build_world(world, int(task)) for task in rng.choice(64, size=TASKS, replace=False))
    return sample_from(((mdp, policy_of(mdp, kind, rng)) for mdp in mdps), size, anchor, rng)


def sample_from(tasks, size: int, anchor: str, rng):
    """One batch: ``size`` rollouts of each (mdp, tabular policy) of ``tasks`` (a group
    each), its GiGPO inputs and the exact advantages of the policy."""
    cols, exact, traj = defaultdict(list), [], 0
    for g, (mdp, pi) in enumerate(tasks):
        adv = exact_values(mdp, pi, GAMMA).A
        key = (lambda s: g * 1000 + s) if anchor == "state" else \
            (lambda s: hash((g, mdp.observations[s])) % (2 ** 61))
        for _ in range(size):
            for t, st in enumerate(simulate(mdp, pi, rng, MAX_STEPS)):
                for name, value in (("group", g), ("traj", traj), ("t", t),
                                    ("reward", st.reward), ("state", key(st.state)),
                                    ("next_state", key(st.next_state)), ("action", st.action),
                                    ("terminal", st.terminal),
                                    ("nll", -np.log(pi[st.state][st.action]))):
                    cols[name].append(value)
                exact.append(adv[st.state][st.action])
            traj += 1
    return StepBatch(**{k: np.asarray(v) for k, v in cols.items()}), np.asarray(exact)


def one(batch: StepBatch, exact: np.ndarray) -> dict:
    a0, _, u, _, eligible = parts(batch, kappa=0.0)
    e0 = a0 - exact
    z = criticality(batch.nll.astype(float), batch.traj, eligible)
    err = {k: float(np.mean((compute("gaca", batch, kappa=k, norm="mean")[0] - exact) ** 2))
           for k in (*KAPPAS, H)}
    return {"alpha": alignment(z, u, e0), "m2": float(np.mean(z ** 2 * u ** 2)), "err": err}


def cell(world, kind, size, anchor, seeds) -> dict:
    runs = [one(*sample(world, kind, size, anchor,
                        np.random.default_rng([s, size, len(world), len(kind), len(anchor)])))
            for s in range(seeds)]
    mean_err = {k: float(np.mean([r["err"][k] for r in runs])) for k in KAPPAS}
    alpha, m2 = float(np.mean([r["alpha"] for r in runs])), float(np.mean([r["m2"] for r in runs]))
    best = min(KAPPAS, key=lambda k: mean_err[k])
    star = alpha / m2 if m2 > 0 else 0.0
    return {"world": world, "policy": kind, "group_size": size, "anchor": anchor,
            "alpha_mean": alpha, "alpha_positive": float(np.mean([r["alpha"] > 0 for r in runs])),
            # prediction 1: alpha > 0 exactly when the error falls at a tiny kappa
            "slope_identity_holds": all((r["alpha"] > 0) == (r["err"][H] < r["err"][0.0])
                                        for r in runs if abs(r["alpha"]) > 1e-12),
            "slope_identity_exceptions": [s for s, r in enumerate(runs) if abs(r["alpha"]) >
                                          1e-12 and (r["alpha"] > 0) != (r["err"][H] <
                                                                         r["err"][0.0])],
            # the parabola itself: err(h) - err(0) = -2 h alpha + h^2 m2 (no clipping at h)
            "parabola_max_rel_gap": max(abs(r["err"][H] - r["err"][0.0] - (
                -2 * H * r["alpha"] + H * H * r["m2"])) / max(abs(r["err"][H] - r["err"][0.0]),
                                                              1e-300) for r in runs),
            "err_gigpo": mean_err[0.0], "err_best": mean_err[best], "best_kappa": best,
            "kappa_star": star,
            "nearest_to_star": min(KAPPAS, key=lambda k: abs(k - max(star, 0.0)))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    out = []
    for world in sorted(WORLDS):
        for kind in POLICIES:
            for size in (4, 8, 16):
                for anchor in ("state", "text"):
                    c = cell(world, kind, size, anchor, args.seeds)
                    out.append(c)
                    print(json.dumps(c), flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
