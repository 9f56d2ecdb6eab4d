"""GACA's claims 2 and 3 with trained language-model checkpoints as behaviour policies.

    python benchmarks/bench_claims_checkpoints.py --study runs/study-screened \
        [--labels gigpo,gaca,grpo] [--seeds 30] [--json out.json]

The checkpoints are a study's runs (``gaca-study``): each run's warm-up model
(``reference/``, one per study seed) and its final model (``final/model``). Each becomes a
tabular policy on the 16 held-out tasks of the run's world (Diag-Pivots at the run's
level), by scoring the well-formed answer for every action of every state at the
rollout temperature (:mod:`gaca_agent.analysis.tabular`). Then, with exact values under
that policy, the measures of ``bench_claim3.py`` (the NLL against the exact Q-spread, at
pivotal and routine steps) and of ``bench_claim2.py`` (the alignment alpha and GACA's
error against GiGPO's over the kappa grid, group size 8, state anchors), over ``--seeds``
batches per checkpoint; per policy kind, the mean over checkpoints with a 95% interval,
and the share of probability the well-formed answers hold (what the table leaves out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_claim2 import KAPPAS, one, sample_from  # noqa: E402
from bench_claim3 import measures, rows_from, summarise  # noqa: E402

from gaca_agent.analysis.study import t_interval  # noqa: E402
from gaca_agent.analysis.tabular import load_policy, model_policy  # noqa: E402
from gaca_agent.config import load_config  # noqa: E402
from gaca_envs.diag.env import TRAIN_TASKS, TEST_TASKS, build_world  # noqa: E402

ENV = "gaca/Diag-Pivots-v0"


def checkpoints(study: Path, labels: list[str]) -> list[tuple[str, int, str, str]]:
    """(kind, seed, model dir, tokenizer dir): each seed's warm-up once, then each
    label's final model."""
    found, warm = [], set()
    for run in sorted((study / "runs").glob("*__*__s*")):
        _, label, seed = run.name.split("__")
        if label not in labels or not (run / "final" / "model" / "config.json").exists():
            continue
        seed_n = int(seed[1:])
        tok = str(run / "final" / "model")
        if seed_n not in warm and (run / "reference" / "config.json").exists():
            warm.add(seed_n)
            found.append(("warm-up", seed_n, str(run / "reference"), tok))
        found.append((f"trained {label}", seed_n, tok, tok))
    return found


def evaluate(model_dir: str, tok_dir: str, temperature: float, level: int, seeds: int,
             seed: int) -> dict:
    policy = load_policy(model_dir, temperature, tok_dir)
    tasks = [build_world("pivots", TRAIN_TASKS + t, level) for t in range(TEST_TASKS)]
    made = [(mdp, *model_policy(policy, mdp, ENV)) for mdp in tasks]
    tables = [(mdp, pi) for mdp, pi, _ in made]
    mass = np.concatenate([m for _, _, m in made])
    claim3 = summarise([measures(rows_from(tables, np.random.default_rng([s, seed, 3])))
                        for s in range(seeds)])
    runs = [one(*sample_from(tables, 8, "state", np.random.default_rng([s, seed, 2])))
            for s in range(seeds)]
    err = {k: float(np.mean([r["err"][k] for r in runs])) for k in KAPPAS}
    return {**claim3, "well_formed_mass": float(np.nanmean(mass)),
            "alpha_mean": float(np.mean([r["alpha"] for r in runs])),
            "alpha_positive": float(np.mean([r["alpha"] > 0 for r in runs])),
            "err_gigpo": err[0.0], "err_best": min(err.values()),
            "best_kappa": min(KAPPAS, key=lambda k: err[k]), "err": err}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", type=Path, default=Path("runs/study-screened"))
    p.add_argument("--labels", default="gigpo,gaca,grpo")
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    found = checkpoints(args.study, args.labels.split(","))
    if not found:
        raise SystemExit(f"no finished runs of {args.labels} under {args.study / 'runs'}")
    results = []
    for kind, seed, model_dir, tok_dir in found:
        cfg = load_config(Path(tok_dir).parent.parent / "config.yaml")
        level = int(cfg.env.eval_kwargs.get("level", 2))
        r = evaluate(model_dir, tok_dir, cfg.model.temperature, level, args.seeds, seed)
        results.append({"kind": kind, "seed": seed, **r})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "err"}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    table(results)


def table(results: list[dict]) -> None:
    keys = ("well_formed_mass", "pearson_spread", "spearman_spread", "nll_pivotal", "nll_routine", "alpha_mean",
            "err_gigpo", "err_best")
    print("| policy | checkpoints | well-formed mass | corr(NLL, spread) | Spearman | NLL pivotal / routine | "
          "alpha | GiGPO MSE | GACA's best MSE | best kappa (per checkpoint) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in dict.fromkeys(r["kind"] for r in results):
        rs = [r for r in results if r["kind"] == kind]
        m = {}
        for k in keys:
            v = [float(r[k]) for r in rs if r[k] is not None]
            m[k] = "{:.3f} ± {:.3f}".format(*t_interval(v)) if v else "-"
        kappas = ", ".join(f"{k:g}" for k in sorted(r["best_kappa"] for r in rs))
        print(f"| {kind} | {len(rs)} | {m['well_formed_mass']} | {m['pearson_spread']} | {m['spearman_spread']} | "
              f"{m['nll_pivotal']} / {m['nll_routine']} | {m['alpha_mean']} | "
              f"{m['err_gigpo']} | {m['err_best']} | {kappas} |")


if __name__ == "__main__":
    main()
