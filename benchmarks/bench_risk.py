"""GACA's risk, term by term, on every diagnostic world (gaca_agent.analysis.risk).

    python benchmarks/bench_risk.py --seeds 30 [--kappa 0.25] [--json out.json]

Per world and form: batches of 16 tasks x 8 rollouts of the ``aligned`` softmax behaviour
policy at T = 1 (benchmarks/bench_credit.py), advantages with ``norm="mean"`` (reward
units), and the mean over seeds of the fixed mixture's error, the alignment term, the
modulation energy and the measured error, the largest gap between the sum of the terms
and the measured error, and the share of seeds whose alignment term is negative (the
modulation lowers the error along its direction).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_credit import sample_batch  # noqa: E402

from gaca_agent.analysis.risk import decompose, mixture, parts  # noqa: E402
from gaca_envs.diag.worlds import WORLDS  # noqa: E402


def terms(batch, exact, form: str, kappa: float) -> dict[str, float]:
    _, a_e, a_s, mix, eligible = parts(batch, form=form, kappa=kappa)
    return decompose(*mixture(a_e, a_s, mix, form, eligible=eligible), exact)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--kappa", type=float, default=0.25)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    out = []
    print("| world | form | fixed | alignment | energy | measured | max gap | alignment < 0 |")
    print("|---|---|---|---|---|---|---|---|")
    for world in sorted(WORLDS):
        batches = [sample_batch(world, "aligned", 1.0, np.random.default_rng([s, 7]))
                   for s in range(args.seeds)]
        for form in ("linear", "sigmoid", "convex"):
            ts = [terms(b, e, form, args.kappa) for b, e in batches]
            mean = {k: float(np.mean([t[k] for t in ts])) for k in ts[0]}
            gap = max(abs(t["fixed"] + t["alignment"] + t["energy"] - t["measured"])
                      for t in ts)
            neg = float(np.mean([t["alignment"] < 0 for t in ts]))
            out.append({"world": world, "form": form, **mean, "max_gap": gap,
                        "alignment_negative": neg})
            print(f"| {world} | {form} | {mean['fixed']:.5f} | {mean['alignment']:+.5f} | "
                  f"{mean['energy']:.5f} | {mean['measured']:.5f} | {gap:.1e} | {neg:.2f} |",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
