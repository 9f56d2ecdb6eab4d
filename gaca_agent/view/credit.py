"""The credit views of ``gaca-view``, as plain data: an iteration's groups, one step with
its anchor group, estimators side by side, the anchor audit's groups, a suite comparison.

A step is named by its trajectory and time step (``traj``, ``t``). Its **anchor group**
is the rows of its task group whose canonical state key equals its own (what GiGPO and
GACA pool); the **text anchor** (GiGPO's exact observation text) would group it with the
rows of the same observation instead: rows it would *merge* (same text, another state)
and *split* off (same state, another text) are listed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

STEP_FIELDS = ("t", "observation", "admissible_actions", "response", "action", "format_valid",
               "action_valid", "reward", "env_reward", "penalty", "state_key",
               "next_state_key", "terminated", "truncated", "nll", "nll_spans", "entropy",
               "advantage", "weight")


def _num(x: Any) -> float | None:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def _valid(step: dict[str, Any]) -> bool:
    return bool(step.get("format_valid", True)) and bool(step.get("action_valid", True))


def groups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Task groups, each with its trajectories as compact step columns."""
    by: dict[Any, dict[str, Any]] = {}
    for r in records:
        g = by.setdefault(str(r.get("group", r["index"])), {
            "group": str(r.get("group", r["index"])), "task_id": r.get("task_id"),
            "task": r.get("task", ""), "task_type": r.get("task_type"), "trajs": []})
        g["trajs"].append({
            "traj": str(r["traj"]), "won": bool(r.get("won")), "reward": _num(r.get("reward")),
            "failed": bool(r.get("failed")), "error": r.get("error") or "",
            "steps": [{"t": s.get("t"), "action": str(s.get("action", "")),
                       "advantage": _num(s.get("advantage")), "weight": _num(s.get("weight")),
                       "reward": _num(s.get("reward")), "valid": _valid(s)}
                      for s in r.get("trajectory") or []]})
    return list(by.values())


def _rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"group": str(r.get("group", r["index"])), "traj": str(r["traj"]), **s}
            for r in records if not r.get("failed") for s in r.get("trajectory") or []]


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    return {"traj": row["traj"], "t": row.get("t"), "action": str(row.get("action", "")),
            "advantage": _num(row.get("advantage")), "weight": _num(row.get("weight")),
            "reward": _num(row.get("reward")), "state_key": str(row.get("state_key")),
            "observation": str(row.get("observation", ""))}


def step(records: list[dict[str, Any]], traj: str, t: int) -> dict[str, Any]:
    """One step's fields, its anchor group, and how text anchors would regroup it."""
    from gaca_agent.view.store import NotFound

    rows = _rows(records)
    match = [r for r in rows if r["traj"] == str(traj) and int(r.get("t", -1)) == int(t)]
    if not match:
        raise NotFound(f"no step t={t} in trajectory {traj}")
    me = match[0]
    mates = [r for r in rows if r["group"] == me["group"]]
    same_state = [r for r in mates if r.get("state_key") == me.get("state_key")]
    same_text = [r for r in mates if r.get("observation") == me.get("observation")]
    return {"step": {k: me.get(k) for k in STEP_FIELDS}, "traj": me["traj"],
            "group": me["group"], "anchor_group": [_brief(r) for r in same_state],
            "text_merges": [_brief(r) for r in same_text
                            if r.get("state_key") != me.get("state_key")],
            "text_splits": [_brief(r) for r in same_state
                            if r.get("observation") != me.get("observation")]}


def audit_groups(records: list[dict[str, Any]], limit: int = 200) -> dict[str, Any]:
    """Text-anchor groups that alias several canonical states, and canonical states that
    text anchors split, within task groups, largest first (``limit`` of each)."""
    rows = _rows(records)
    by_text, by_state = defaultdict(list), defaultdict(list)
    for r in rows:
        by_text[(r["group"], str(r.get("observation")))].append(r)
        by_state[(r["group"], str(r.get("state_key")))].append(r)
    aliased = [{"group": g, "observation": text, "states": sorted({str(r.get("state_key"))
                                                                  for r in members}),
                "rows": [_brief(r) for r in members]}
               for (g, text), members in by_text.items()
               if len({r.get("state_key") for r in members}) > 1]
    split = [{"group": g, "state_key": key, "texts": sorted({str(r.get("observation"))
                                                            for r in members}),
              "rows": [_brief(r) for r in members]}
             for (g, key), members in by_state.items()
             if len({r.get("observation") for r in members}) > 1]
    aliased.sort(key=lambda a: -len(a["rows"]))
    split.sort(key=lambda a: -len(a["rows"]))
    return {"rows": len(rows), "text_groups": len(by_text), "states": len(by_state),
            "aliased": aliased[:limit], "split": split[:limit],
            "aliased_total": len(aliased), "split_total": len(split)}


def compare(files: list, source: dict[str, Any], estimators: list[str], anchor: str = "state",
            top: int = 30) -> dict[str, Any]:
    """Every chosen estimator on the stored rollout (``gaca-rescore``'s code), per step,
    the exact advantage on diagnostic worlds, and the steps they rank most differently."""
    from gaca_agent.advantages import names
    from gaca_agent.analysis.rescore import average_ranks, rescore, step_rows

    unknown = [e for e in estimators if e not in names()]
    if unknown or len(estimators) < 2:
        raise ValueError(f"choose two or more of {names()}; got {estimators}")
    rows = step_rows(files)
    result = rescore(rows, source, estimators, {}, anchor)
    adv = {k: v.tolist() for k, v in result.pop("_advantages").items()}
    exact = result.pop("_exact")
    truth = None if exact is None else [float(x) if m else None
                                        for m, x in zip(exact[0], exact[1])]
    ranks = {k: average_ranks(v).tolist() for k, v in adv.items()}
    a, b = estimators[0], estimators[1]
    gap = [abs(x - y) for x, y in zip(ranks[a], ranks[b])]
    order = sorted(range(len(rows)), key=lambda i: -gap[i])[:top]
    # step_rows names an evaluation's trajectory (file, index): the index is the view's
    per_row = [{"traj": str(r["traj"][-1] if isinstance(r["traj"], tuple) else r["traj"]),
                "t": r["t"], "action": str(r["action"]),
                "group": str(r["group"]), **{k: adv[k][i] for k in estimators},
                "exact": None if truth is None else truth[i]} for i, r in enumerate(rows)]
    return {"estimators": estimators, "spearman": result["spearman"],
            "summary": {k: {x: v[x] for x in ("mean", "std", "positive", "exact_corr",
                                                "exact_mse") if x in v}
                        for k, v in result["estimators"].items()},
            "rows": per_row, "has_exact": truth is not None,
            "disagreements": [{**per_row[i], "rank_gap": gap[i]} for i in order]}


def suite(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Success per task type of two evaluations, with 95% Wilson intervals."""
    from gaca_agent.runs.results import wilson

    def per_type(records):
        out = defaultdict(lambda: [0, 0])
        for r in records:
            if r.get("failed"):
                continue
            for key in ((r["task_type"],) if r.get("task_type") else ()) + ("overall",):
                out[key][0] += bool(r.get("won"))
                out[key][1] += 1
        return out

    pa, pb = per_type(a), per_type(b)
    table = []
    for key in sorted(set(pa) | set(pb), key=lambda k: (k == "overall", k)):
        row = {"task_type": key}
        for side, p in (("a", pa), ("b", pb)):
            won, n = p.get(key, (0, 0))
            row[side] = {"won": won, "n": n, "success": won / n if n else None,
                         "ci": list(wilson(won, n))}
        table.append(row)
    return table
