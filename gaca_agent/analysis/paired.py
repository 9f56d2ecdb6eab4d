"""Two evaluations of the same plan (the same env, kwargs, episodes and seed: the same
tasks and seeds, episode by episode) compared pair by pair: ``gaca-eval --compare A B``.

Two success rates over the same 64 tasks are not two independent samples: a task one
policy solves the other often solves too. The test that uses the pairing counts only the
episodes where the two differ (one won, the other did not) and asks how likely so
lopsided a split is when neither policy is better: the exact two-sided sign test
(McNemar's exact test). Failed episodes (a crashed env) are left out of both.
"""

from __future__ import annotations

import json
from pathlib import Path

from gaca_agent.analysis.significance import sign_test

#: What must be equal for two evaluations to have played the same episodes.
PLAN_KEYS = ("env", "env_kwargs", "episodes", "seed", "group_size")


def _plan(folder: Path) -> dict | None:
    path = folder / "config.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    return {k: meta.get(k, 1 if k == "group_size" else None) for k in PLAN_KEYS}


def _wins(folder: Path) -> dict[int, bool]:
    from gaca_agent.runs.results import read_episodes

    return {i: bool(r["won"]) for i, r in read_episodes(folder / "episodes.jsonl").items()
            if not r["failed"]}


def paired(a: dict[int, bool], b: dict[int, bool]) -> dict[str, float]:
    """The paired comparison of two evaluations' wins by episode index (pure)."""
    both = sorted(set(a) & set(b))
    only_a = sum(a[i] and not b[i] for i in both)
    only_b = sum(b[i] and not a[i] for i in both)
    return {"n": len(both), "won_a": sum(a[i] for i in both), "won_b": sum(b[i] for i in both),
            "only_a": only_a, "only_b": only_b,
            "p": sign_test([float(b[i]) - float(a[i]) for i in both])}


def paired_line(a: Path, b: Path) -> str | None:
    """One line comparing evaluation folders ``a`` and ``b`` pair by pair, or None when
    they did not play the same plan."""
    plan = _plan(a)
    if plan is None or plan != _plan(b):
        return None
    r = paired(_wins(a), _wins(b))
    if not r["n"]:
        return None
    return (f"paired over the {r['n']} episodes both played (same tasks and seeds): "
            f"{a} won {r['won_a']:.0f}, {b} won {r['won_b']:.0f}; only {b}: "
            f"{r['only_b']:.0f}, only {a}: {r['only_a']:.0f}; exact sign test "
            f"(McNemar) p = {r['p']:.3g}")
