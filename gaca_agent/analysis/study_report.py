"""``gaca-study``'s report: the tables (Markdown) and learning-curve plots of a study's
aggregate (:func:`gaca_agent.analysis.study.aggregate`) and paired comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gaca_agent.analysis.study import METRIC_NAMES, METRICS
from gaca_agent.runs.rundir import eval_points, read_metrics


def markdown(summary: dict[str, Any]) -> str:
    lines = []
    for env_label, table in summary.items():
        lines += [f"### {env_label}", "",
                  "| estimator | seeds | warm-up | final held-out success | AUC (mean over the "
                  "evaluations, the warm-up's included) |",
                  "|---|---|---|---|---|"]
        for label, s in sorted(table.items(), key=lambda kv: -(kv[1]["final"] or {}).get("mean", 0)):
            warm = s["curve"].get("-1", {}).get("mean", float("nan"))
            fin, auc = s["final"] or {"mean": float("nan"), "ci95": 0.0}, s["auc"]
            lines.append(f"| {label} | {s['seeds']} | {warm:.3f} | {fin['mean']:.3f} ± "
                         f"{fin['ci95']:.3f} | {auc['mean']:.3f} ± {auc['ci95']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict[str, Any], out: Path) -> list[Path]:
    """Per environment: estimators' held-out success (mean, 95% interval clipped to
    [0, 1]), GACA's ablations, and the diagnostics over training."""
    from gaca_agent.runs.plots import figure, pyplot

    colours = pyplot().get_cmap("tab20")
    paths = []
    for env_label, table in summary.items():
        labels = sorted(table)
        colour = {label: colours(i % 20) for i, label in enumerate(labels)}
        ablations = [lb for lb in labels if lb.startswith("gaca-")]
        panels = 4 if ablations else 3
        path = out / f"study_{env_label}.png"
        with figure(path, 1, panels, figsize=(5 * panels, 4)) as (fig, axes):
            curve_axes = [axes[0]] + ([axes[1]] if ablations else [])
            for label in labels:
                s = table[label]
                its = sorted(int(k) for k in s["curve"])
                mean = [s["curve"][str(i)]["mean"] for i in its]
                ci = [s["curve"][str(i)]["ci95"] for i in its]
                groups = [curve_axes[-1]] if label.startswith("gaca-") else [curve_axes[0]]
                if label == "gaca" and ablations:
                    groups.append(curve_axes[-1])
                for ax in groups:
                    ax.plot(its, mean, marker="o", ms=3, label=label, color=colour[label])
                    ax.fill_between(its, [max(0.0, m - c) for m, c in zip(mean, ci)],
                                    [min(1.0, m + c) for m, c in zip(mean, ci)], alpha=0.12,
                                    color=colour[label])
                for ax, key in ((axes[-2], "adv/weight_std"), (axes[-1], "adv/singleton_frac")):
                    d = s["diagnostics"].get(key, {})
                    if d:
                        ax.plot([int(k) for k in d], list(d.values()), label=label,
                                color=colour[label], ls=":" if label.startswith("gaca-") else "-")
            axes[0].set_title(f"{env_label}: held-out success (mean, 95% CI)")
            if ablations:
                axes[1].set_title("GACA ablations (forms, kappa, nll_span)")
            axes[-2].set_title("step-weight spread (adv/weight_std)")
            axes[-1].set_title("singleton anchor fraction")
            for ax in curve_axes:
                ax.set_ylim(-0.02, 1.02)
                ax.legend(fontsize=7)
            for ax in axes:
                ax.set_xlabel("iteration (-1: after the warm-up)")
                ax.grid(alpha=0.3)
            axes[-2].legend(fontsize=6, ncol=2)
        paths.append(path)
    return paths


def paired_markdown(result: dict[str, Any]) -> str:
    lines = []
    for env_label, table in result.items():
        lines += [f"### {env_label}: paired differences per seed", "",
                  "| comparison | metric | seeds | mean difference (95% CI) | wins / losses / "
                  "ties | t test p (Holm) | sign test p (Holm) |",
                  "|---|---|---|---|---|---|---|"]
        for name, entry in table.items():
            for metric in (k for k in METRICS if k in entry):  # older tables: final, auc
                m = entry[metric]
                lines.append(f"| {name} | {METRIC_NAMES[metric]} | "
                             f"{len(entry['seeds'])} | {m['mean']:+.3f} ({m['ci95'][0]:+.3f} "
                             f"to {m['ci95'][1]:+.3f}) | {m['wins']} / {m['losses']} / "
                             f"{m['ties']} | {_p(m, 't_test')} | {_p(m, 'sign_test')} |")
        lines += ["", f"Holm: over the {len(table)} comparisons of this table, per metric "
                  "and test.", ""]
    return "\n".join(lines)


def _p(m: dict[str, Any], test: str) -> str:
    """A raw p value and its Holm adjustment (tables written before Holm: the raw only)."""
    raw = f"{m[f'{test}_p']:.3g}" if f"{test}_p" in m else "-"
    return f"{raw} ({m[f'{test}_holm']:.3g})" if f"{test}_holm" in m else raw


def seed_markdown(out: Path, runs) -> str:
    """Per environment and seed: the warm-up's held-out success, then each label's held-out
    success at its evaluation points after it (the runs a paired comparison pairs)."""
    curves: dict[str, dict[int, dict[str, list[tuple[int, float]]]]] = {}
    for run in runs:
        points = eval_points(read_metrics(out / "runs" / run.name))
        if points:
            curves.setdefault(run.env_label, {}).setdefault(run.seed, {})[run.label] = points
    lines = []
    for env_label, seeds in curves.items():
        labels = list(dict.fromkeys(r.label for r in runs if r.env_label == env_label))
        lines += [f"### {env_label}: held-out success per seed (after the warm-up, then at each "
                  "evaluation)", "", "| seed | warm-up | " + " | ".join(labels) + " |",
                  "|---" * (len(labels) + 2) + "|"]
        for seed, by_label in sorted(seeds.items()):
            warm = next((v for pts in by_label.values() for it, v in pts if it == -1), None)
            cells = [" ".join(f"{v:.2f}" for it, v in by_label[lb] if it >= 0)
                     if lb in by_label else "-" for lb in labels]
            lines.append(f"| {seed} | {'-' if warm is None else f'{warm:.2f}'} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
