"""Calibrated step-level credit against exact advantages, on every diagnostic world.

    python benchmarks/bench_calibration.py --seeds 30 [--json out.json]

Per world x behaviour (the ``aligned`` softmax policy of bench_credit.py at T = 1, a
warmed-up policy's stand-in, and at T = 0.5, a confident one that takes the other action
rarely) x group size (4, 8 rollouts of 16 tasks), 30 seeds; every estimator below on the
same batches:

- ``mse``: mean squared error to the exact advantage A(s, a) of the row's state and
  action (advantages with ``norm="mean"``, reward units); ``corr``: Pearson correlation
  (``norm="std"``);
- at **rare-action rows** (the row's action was taken at most twice in an anchor group
  where another action was also taken: where divergent anchor bias can arise), with the
  row's step term u = w_t A^S_t: ``flip``, the share whose u has the sign opposite to
  GiGPO's (omega 1; a GiGPO u of 0 is not flipped); ``zeroed``, the share where GiGPO's
  u is not 0 and this one's is; ``wrong``/``right``, the share whose u has the sign
  opposite to / the same as the exact advantage (a u of 0 is neither).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_credit import sample_batch  # noqa: E402
import bench_credit  # noqa: E402
from gaca_agent.advantages import compute, prepare  # noqa: E402
from gaca_agent.advantages.actions import action_stats  # noqa: E402
from gaca_envs.diag.worlds import WORLDS  # noqa: E402

CONFIGS: list[tuple[str, str, dict]] = [
    ("gigpo", "gigpo", {}), ("gigpo-w0.25", "gigpo", {"omega": 0.25}),
    ("gaca", "gaca", {}), ("adastep", "adastep", {}), ("ecpo", "ecpo", {}),
    ("ecpo-nogate", "ecpo", {"gate": False}), ("shrink", "shrink", {}),
    ("spread", "spread", {}),
]
SETTINGS = [(1.0, 8), (1.0, 4), (0.5, 8), (0.5, 4)]


def rare_rows(batch) -> np.ndarray:
    p = prepare(batch)
    s = action_stats(p.returns_to_go(bench_credit.GAMMA), p.anchor, p.field("action", "rare"),
                     "mean")
    return (s.n_action <= 2) & (s.k_actions >= 2)


def in_reward_units(name: str, params: dict, batch) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, step terms w_t A^S_t) with ``norm="mean"``."""
    adv, _, rows = compute(name, batch, details=True, norm="mean", **params)
    return adv, rows["weight"] * rows["step_adv"]


def measure(batch, exact) -> dict[str, dict[str, float]]:
    rare = rare_rows(batch)
    runs = {label: in_reward_units(name, params, batch) for label, name, params in CONFIGS}
    base = runs["gigpo"][1][rare]
    truth = np.sign(exact[rare])
    out = {}
    for label, name, params in CONFIGS:
        adv, u = runs[label][0], runs[label][1][rare]
        std_adv = compute(name, batch, **params)[0]
        out[label] = {
            "mse": float(np.mean((adv - exact) ** 2)),
            "corr": float(np.corrcoef(std_adv, exact)[0, 1]) if std_adv.std() > 0 else 0.0,
            "rare": float(rare.mean()),
            "flip": float(np.mean((np.sign(u) == -np.sign(base)) & (base != 0)))
            if rare.any() else 0.0,
            "zeroed": float(np.mean((u == 0) & (base != 0))) if rare.any() else 0.0,
            "wrong": float(np.mean(np.sign(u) == -truth)) if rare.any() else 0.0,
            "right": float(np.mean((np.sign(u) == truth) & (u != 0))) if rare.any() else 0.0,
        }
    return out


def run(seeds: int) -> list[dict]:
    results = []
    for world in sorted(WORLDS):
        for temperature, size in SETTINGS:
            bench_credit.GROUP_SIZE = size
            per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for seed in range(seeds):
                batch, exact = sample_batch(world, "aligned", temperature,
                                            np.random.default_rng([seed, 43, size]))
                for label, values in measure(batch, exact).items():
                    for key, v in values.items():
                        per[label][key].append(v)
            for label, values in per.items():
                row = {"world": world, "T": temperature, "group_size": size,
                       "estimator": label}
                row.update({k: float(np.mean(v)) for k, v in values.items()})
                row["mse_ci"] = float(1.96 * np.std(values["mse"], ddof=1) / np.sqrt(seeds))
                row["mse_below_gigpo"] = float(np.mean(
                    np.asarray(values["mse"]) < np.asarray(per["gigpo"]["mse"])))
                results.append(row)
            print(f"done {world} T={temperature} n={size}", file=sys.stderr, flush=True)
    return results


def table(results: list[dict]) -> str:
    labels = [label for label, _, _ in CONFIGS]
    lines = ["| world | T | n | " + " | ".join(labels) + " |",
             "|---|---|---|" + "---|" * len(labels)]
    by = defaultdict(dict)
    for r in results:
        by[(r["world"], r["T"], r["group_size"])][r["estimator"]] = r
    for (world, T, n), rows in by.items():
        best = min(rows.values(), key=lambda r: r["mse"])["estimator"]
        cells = [(f"**{rows[k]['mse']:.4f}**" if k == best else f"{rows[k]['mse']:.4f}")
                 for k in labels]
        lines.append(f"| {world} | {T} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Rare-action rows (share of rows; then per estimator wrong / right sign "
              "against the exact advantage, and flipped / zeroed against GiGPO's):", "",
              "| world | T | n | rare | " + " | ".join(labels) + " |",
              "|---|---|---|---|" + "---|" * len(labels)]
    for (world, T, n), rows in by.items():
        cells = [f"{rows[k]['wrong']:.2f} / {rows[k]['right']:.2f} ({rows[k]['flip']:.2f}, "
                 f"{rows[k]['zeroed']:.2f})" for k in labels]
        lines.append(f"| {world} | {T} | {n} | {rows['gigpo']['rare']:.3f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    return bench_credit.seeds_main(__doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
