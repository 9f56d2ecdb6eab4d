"""``gaca-rescore``: one stored rollout batch, scored by every estimator.

    gaca-rescore runs/default --estimators grpo,gigpo,gaca,adastep,pgpo
    gaca-rescore runs/default --iteration 3 --anchor observation
    gaca-rescore runs/eval/diag-groups --params gaca:kappa=1.0

The same rollouts go through every estimator, so differences between them are the
estimators' and not rollout noise. Input: a training run (its ``rollouts/`` of one
iteration, the last by default; every rank's file), a ``gaca-eval`` folder or an
``episodes.jsonl`` (use ``gaca-eval --group-size`` so that there are task groups).
Failed episodes are left out. Reports, per estimator: the advantage distribution (mean,
std, quantiles, share positive); the pairwise Spearman rank correlations; for step-level
estimators the weight diagnostics (GACA's w_t: mean, spread, correlation with |A^S| and
with the step NLL). On diagnostic envs (``gaca/Diag-*``) it also scores each estimator
against the exact advantage A(s, a) of the behaviour policy, estimated as the empirical
action frequencies of each (task, state) in the batch: the Pearson correlation (as run)
and the mean squared error in reward units (run with ``norm="mean"`` where the estimator
has that option). Writes ``rescore.json``, ``rescore.md`` and ``rescore.png``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from gaca_agent.runs.plots import figure

from gaca_agent.analysis.audit import read_records
from gaca_agent.steps import action_code, code

DEFAULTS: dict[str, dict[str, Any]] = {
    "gigpo": {"gamma": 0.95, "omega": 1.0}, "gaca": {"gamma": 0.95, "omega": 1.0},
    "adastep": {"gamma": 0.95}, "pgpo": {"gamma": 0.95}, "graft": {"gamma": 0.95},
}


def rollout_files(path: Path, iteration: int | None) -> tuple[list[Path], dict[str, Any]]:
    """The episode files of one batch and where they came from (env id, kwargs)."""
    from gaca_agent.runs.exported import export_source, is_export

    if is_export(path):
        if iteration is not None:
            raise ValueError(f"{path} is a gaca-export (every iteration it holds is scored);"
                             " export one iteration with gaca-export --iteration")
        return [path], export_source(path)
    found, source = source_files(path)
    its = sorted({it for it, _ in found if it >= 0})
    if not its:  # an evaluation or a single file
        return [f for _, f in found], source
    it = its[-1] if iteration is None else iteration
    if it not in its:
        raise ValueError(f"{path} has no rollouts of iteration {it}; it has {its}")
    return [f for i, f in found if i == it], {**source, "iteration": it}


def source_files(path: Path) -> tuple[list[tuple[int, Path]], dict[str, Any]]:
    """(iteration, file) of every episode file of a training run (every kept iteration)
    or of an evaluation or file (iteration -1), and where they came from."""
    path = Path(path)
    if path.is_file():
        return [(-1, path)], _source(path.parent)
    files = sorted(path.glob("rollouts/iter-*.jsonl.gz"))
    if files:
        return [(int(re.search(r"iter-(\d+)", f.name).group(1)), f) for f in files], \
            _source(path)
    if (path / "episodes.jsonl").is_file():
        return [(-1, path / "episodes.jsonl")], _source(path)
    raise FileNotFoundError(f"{path} holds neither rollouts/*.jsonl.gz nor episodes.jsonl")


def _source(folder: Path) -> dict[str, Any]:
    if (folder / "config.json").is_file():
        meta = json.loads((folder / "config.json").read_text())
        return {"env": meta.get("env"), "env_kwargs": meta.get("env_kwargs", {})}
    if (folder / "config.yaml").is_file():
        import yaml

        env = (yaml.safe_load((folder / "config.yaml").read_text()) or {}).get("env", {})
        return {"env": env.get("id"), "env_kwargs": env.get("kwargs", {})}
    return {"env": None, "env_kwargs": {}}


def step_rows(files: list[Path]) -> list[dict[str, Any]]:
    """One dict per step of every non-failed episode, with its episode's ids."""
    rows = []
    for n, file in enumerate(files):
        for record in read_records(file):
            if record.get("failed"):
                continue
            # a training iteration's groups span the ranks' files; elsewhere per file
            training = file.parent.name == "rollouts"
            traj = record.get("traj", record["index"]) if training else \
                (n, record.get("traj", record["index"]))
            group = record["group"] if training else (n, record.get("group", record["index"]))
            for step in record["trajectory"]:
                rows.append({**step, "group": group, "traj": traj,
                             "task_id": record["task_id"], "task": record.get("task", "")})
    return rows


def batch_of(rows: list[dict[str, Any]], anchor: str):
    from gaca_agent.advantages import StepBatch

    def codes(key):
        return np.asarray([code(str(r[key])) for r in rows], dtype=np.int64)

    groups = {g: i for i, g in enumerate(dict.fromkeys(r["group"] for r in rows))}
    trajs = {t: i for i, t in enumerate(dict.fromkeys(r["traj"] for r in rows))}
    nll = np.asarray([float(r.get("nll", 0.0)) for r in rows])
    entropy = np.asarray([r["entropy"] if r.get("entropy") is not None else n
                          for r, n in zip(rows, nll)], dtype=np.float64)
    state = codes("observation") if anchor == "observation" else codes("state_key")
    return StepBatch(
        group=np.asarray([groups[r["group"]] for r in rows]),
        traj=np.asarray([trajs[r["traj"]] for r in rows]),
        t=np.asarray([r["t"] for r in rows]), reward=np.asarray([r["reward"] for r in rows]),
        state=state, next_state=codes("next_state_key"),
        action=np.asarray([action_code(r["action"]) for r in rows]), nll=nll,
        terminal=np.asarray([bool(r["terminated"]) for r in rows]), entropy=entropy,
        penalty=np.asarray([float(r.get("penalty", 0.0)) for r in rows]),
        observation=[r["observation"] for r in rows])


def average_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of ``x``, ties given their average rank."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=r)
    return (sums / counts)[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from gaca_agent.advantages.stats import safe_corr

    return safe_corr(average_ranks(a), average_ranks(b))


def exact_advantages(rows: list[dict[str, Any]], source: dict[str, Any], gamma: float):
    """(row mask, exact A(s, a) of the empirical behaviour policy) on Diag envs, else None."""
    env_id = source.get("env") or ""
    if not env_id.startswith("gaca/Diag-"):
        return None
    import gymnasium as gym

    import gaca_envs
    from gaca_envs.diag import exact_values

    gym.register_envs(gaca_envs)
    env = gym.make(env_id, **source.get("env_kwargs", {})).unwrapped
    by_task: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_task[r["task_id"]].append(i)
    mask, truth = np.zeros(len(rows), bool), np.zeros(len(rows))
    for task, idx in by_task.items():
        mdp, keys = env.mdp_for(task), env.state_keys(task)
        counts = [np.zeros(len(a)) for a in mdp.actions]
        located = []
        for i in idx:
            s = keys.get(rows[i]["state_key"])
            action = rows[i]["action"].lower()
            if s is not None and rows[i]["action_valid"] and action in mdp.actions[s]:
                a = mdp.actions[s].index(action)
                counts[s][a] += 1
                located.append((i, s, a))
        policy = [c / c.sum() if c.sum() else np.full(len(c), 1 / len(c)) for c in counts]
        values = exact_values(mdp, policy, gamma)
        for i, s, a in located:
            mask[i], truth[i] = True, values.A[s][a]
    return mask, truth


def sign_changes(a: np.ndarray, reference: np.ndarray, rows: list[dict[str, Any]],
                 anchor: str, top: int = 5) -> dict[str, Any]:
    """How often ``a`` gives a row the sign opposite to ``reference``'s (GiGPO's), how
    often it gives 0 where the reference does not, and the anchors where the flips are
    most frequent: each named by its observation text, with the actions flipped there."""
    flipped = a * reference < 0
    where: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    shown: dict[tuple, str] = {}
    field = "observation" if anchor == "observation" else "state_key"

    def key(r):  # an anchor group: its task group's rows in one state
        return (str(r["group"]), str(r[field]))

    for i, r in enumerate(rows):
        where[key(r)][1] += 1
        where[key(r)][0] += int(flipped[i])
        shown.setdefault(key(r), str(r.get("observation") or r[field]))
    worst = sorted(((f, n, k) for k, (f, n) in where.items() if f), reverse=True)[:top]
    actions = defaultdict(set)
    for i in np.flatnonzero(flipped):
        actions[key(rows[i])].add(rows[i]["action"])
    return {"flipped": float(flipped.mean()) if len(a) else 0.0,
            "zeroed": float(np.mean((a == 0) & (reference != 0))) if len(a) else 0.0,
            "anchors": [{"anchor": shown[k], "flipped": f, "rows": n,
                         "actions": sorted(actions[k])} for f, n, k in worst]}


def rescore(rows, source, estimators: list[str], params: dict[str, dict], anchor: str
            ) -> dict[str, Any]:
    from gaca_agent.advantages import compute, get
    from gaca_agent.advantages.stats import safe_corr

    batch = batch_of(rows, anchor)
    nll = np.asarray(batch.nll, dtype=np.float64)
    adv: dict[str, np.ndarray] = {}
    result: dict[str, Any] = {"rows": len(rows), "trajectories": len(set(batch.traj.tolist())),
                              "groups": len(set(batch.group.tolist())), "anchor": anchor,
                              "estimators": {}}
    for name in estimators:
        p = {**DEFAULTS.get(name, {}), **params.get(name, {})}
        a, diag, details = compute(name, batch, details=True, **p)
        adv[name] = a
        q = np.quantile(a, [0.05, 0.25, 0.5, 0.75, 0.95]) if len(a) else [0.0] * 5
        entry = {"params": p, "mean": float(a.mean()), "std": float(a.std()),
                 "quantiles": dict(zip(("5", "25", "50", "75", "95"), map(float, q))),
                 "positive": float((a > 0).mean()), "diagnostics": diag}
        if details["weight"].any():
            entry["weight_nll_corr"] = safe_corr(details["weight"], nll)
        result["estimators"][name] = entry
    result["spearman"] = {f"{a}|{b}": spearman(adv[a], adv[b])
                          for i, a in enumerate(estimators) for b in estimators[i + 1:]}
    if "gigpo" in adv:
        result["sign_changes"] = {name: sign_changes(adv[name], adv["gigpo"], rows, anchor)
                                  for name in estimators if name != "gigpo"}
    exact = exact_advantages(rows, source, DEFAULTS["gigpo"]["gamma"])
    if exact is not None:
        mask, truth = exact
        result["exact_rows"] = int(mask.sum())
        for name in estimators:
            p = {**DEFAULTS.get(name, {}), **params.get(name, {})}
            fields = {f.name for f in dataclasses.fields(get(name).config)}
            mean_norm = compute(name, batch, **({**p, "norm": "mean"} if "norm" in fields
                                                 else p))[0]
            result["estimators"][name]["exact_corr"] = safe_corr(adv[name][mask], truth[mask])
            result["estimators"][name]["exact_mse"] = float(
                np.mean((mean_norm[mask] - truth[mask]) ** 2)) if mask.any() else 0.0
    result["_advantages"], result["_exact"] = adv, exact  # per row, for plots and gaca-view
    return result


def markdown(result: dict[str, Any]) -> str:
    names = list(result["estimators"])
    exact = "exact_rows" in result
    head = ["| estimator | mean | std | 5% / 50% / 95% | positive | w_t mean / std | "
            "w_t-NLL corr |" + (" exact corr | exact MSE |" if exact else "")]
    head.append("|---|---|---|---|---|---|---|" + ("---|---|" if exact else ""))
    for n in names:
        e = result["estimators"][n]
        q, d = e["quantiles"], e["diagnostics"]
        row = (f"| {n} | {e['mean']:+.3f} | {e['std']:.3f} | {q['5']:+.2f} / {q['50']:+.2f} / "
               f"{q['95']:+.2f} | {e['positive']:.2f} | {d['weight_mean']:.2f} / "
               f"{d['weight_std']:.2f} | "
               + (f"{e['weight_nll_corr']:+.2f} |" if "weight_nll_corr" in e else "- |"))
        if exact:
            row += f" {e['exact_corr']:+.3f} | {e['exact_mse']:.4f} |"
        head.append(row)
    corr = ["", "Spearman rank correlations:", "", "| | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names)]
    for a in names:
        cells = []
        for b in names:
            if a == b:
                cells.append("1")
            else:
                key = f"{a}|{b}" if f"{a}|{b}" in result["spearman"] else f"{b}|{a}"
                cells.append(f"{result['spearman'][key]:+.2f}")
        corr.append(f"| {a} | " + " | ".join(cells) + " |")
    flips = []
    if result.get("sign_changes"):
        flips = ["", "Signs against GiGPO's (share of rows flipped / set to 0; the anchors "
                 "with the most flips):", ""]
        for n, c in result["sign_changes"].items():
            where = "; ".join(f"{' '.join(a['anchor'].split())[:70]!r}: {a['flipped']}/"
                              f"{a['rows']} rows, {', '.join(a['actions'][:3])}"
                              for a in c["anchors"][:2])
            flips.append(f"- {n}: {c['flipped']:.3f} / {c['zeroed']:.3f}"
                         + (f" ({where})" if where else ""))
    return "\n".join(head + corr + flips)


def plot(result: dict[str, Any], path: Path) -> Path:
    adv = result["_advantages"]
    with figure(path, figsize=(7, 4)) as (fig, ax):
        values = [adv[n] for n in adv]
        ax.violinplot(values, showmedians=True)
        ax.set_xticks(range(1, len(adv) + 1), list(adv))
        ax.set_ylabel("advantage per step row")
        ax.set_title(f"{result['rows']} step rows, {result['groups']} task groups: the same "
                     "rollouts under each estimator", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    return path


def parse_params(items: list[str]) -> dict[str, dict[str, Any]]:
    """``estimator:key=value`` items (values parsed as YAML)."""
    import yaml

    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in items:
        name, sep, rest = item.partition(":")
        key, eq, value = rest.partition("=")
        if not (sep and eq and key):
            raise ValueError(f"--params takes estimator:key=value, got {item!r}")
        out[name][key] = yaml.safe_load(value)
    return dict(out)
