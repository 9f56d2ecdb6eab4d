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
error against GiGPO's over the kappa grid, at group sizes 4, 8 and 16, state and text
anchors), over ``--seeds``
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

from bench_claim2 import H, KAPPAS, one, sample_from  # noqa: E402
from bench_claim3 import measures, rows_from, summarise  # noqa: E402

from gaca_agent.analysis.significance import t_interval  # noqa: E402
from gaca_agent.analysis.study import Run  # noqa: E402
from gaca_agent.analysis.tabular import load_policy, model_policy  # noqa: E402
from gaca_agent.config import load_config  # noqa: E402
from gaca_envs.diag.env import TRAIN_TASKS, TEST_TASKS, build_world  # noqa: E402

ENV = "gaca/Diag-Pivots-v0"


def checkpoints(study: Path, labels: list[str]) -> list[tuple[str, int, str, str]]:
    """(kind, seed, model dir, tokenizer dir): each seed's warm-up once, then each
    label's final model."""
    found, warm = [], set()
    for run in sorted((study / "runs").glob("*__*__s*")):
        _, label, seed_n = Run.parse(run.name) or ("", "", -1)
        if label not in labels or not (run / "final" / "model" / "config.json").exists():
            continue
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
    claim2 = {}
    for size in (4, 8, 16):
        for anchor in ("state", "text"):
            runs = [one(*sample_from(tables, size, anchor,
                                     np.random.default_rng([s, seed, size, len(anchor), 2])))
                    for s in range(seeds)]
            err = {k: float(np.mean([r["err"][k] for r in runs])) for k in KAPPAS}
            claim2[f"n{size}-{anchor}"] = {
                "alpha_mean": float(np.mean([r["alpha"] for r in runs])),
                "alpha_positive": float(np.mean([r["alpha"] > 0 for r in runs])),
                # claim 2's identity: the error falls at a tiny kappa exactly when alpha > 0
                "slope_agrees": float(np.mean([(r["alpha"] > 0) == (r["err"][H] < r["err"][0.0])
                                               for r in runs])),
                "err_gigpo": err[0.0], "err_best": min(err.values()),
                "best_kappa": min(KAPPAS, key=lambda k: err[k]), "err": err}
    return {**claim3, "well_formed_mass": float(np.nanmean(mass)), "claim2": claim2}


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
        print(json.dumps({k: v for k, v in results[-1].items() if k != "claim2"}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    table(results)


def table(results: list[dict]) -> None:
    """Claim 3 per policy kind, then claim 2 per kind, group size and anchor."""
    def mean(rs, get) -> str:
        v = [float(get(r)) for r in rs if get(r) is not None]
        return "{:.3f} ± {:.3f}".format(*t_interval(v)) if v else "-"

    kinds = list(dict.fromkeys(r["kind"] for r in results))
    print("| policy | checkpoints | well-formed mass | corr(NLL, spread) | Spearman | "
          "corr(NLL, Var_pi Q) | NLL pivotal / routine |")
    print("|---|---|---|---|---|---|---|")
    for kind in kinds:
        rs = [r for r in results if r["kind"] == kind]
        print(f"| {kind} | {len(rs)} | {mean(rs, lambda r: r['well_formed_mass'])} | "
              f"{mean(rs, lambda r: r['pearson_spread'])} | "
              f"{mean(rs, lambda r: r['spearman_spread'])} | "
              f"{mean(rs, lambda r: r['pearson_var'])} | {mean(rs, lambda r: r['nll_pivotal'])}"
              f" / {mean(rs, lambda r: r['nll_routine'])} |")
    print()
    print("| policy | cell | alpha > 0 (share of batches) | sign(alpha) = sign of the fall | "
          "GiGPO MSE | GACA's best MSE | best kappa (per checkpoint) |")
    print("|---|---|---|---|---|---|---|")
    for kind in kinds:
        rs = [r for r in results if r["kind"] == kind]
        for name in rs[0]["claim2"]:
            cells = [r["claim2"][name] for r in rs]
            kappas = ", ".join(f"{c['best_kappa']:g}" for c in cells)
            print(f"| {kind} | {name} | {mean(cells, lambda c: c['alpha_positive'])} | "
                  f"{mean(cells, lambda c: c['slope_agrees'])} | "
                  f"{mean(cells, lambda c: c['err_gigpo'])} | "
                  f"{mean(cells, lambda c: c['err_best'])} | {kappas} |")


if __name__ == "__main__":
    main()
