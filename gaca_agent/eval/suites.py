"""Named, versioned evaluation protocols, and side-by-side comparison of their results.

A suite is a list of parts (env id, kwargs, episodes). Results of a suite run carry the
suite's name and version, so tables made on different days compare like with like.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Part:
    name: str
    env_id: str
    env_kwargs: dict[str, Any]
    episodes: str = "all"


@dataclass(frozen=True)
class Suite:
    version: str
    description: str
    parts: tuple[Part, ...]


SUITES: dict[str, Suite] = {
    "alfworld": Suite("1", "ALFWorld valid_seen (140) and valid_unseen (134), every task once",
                      (Part("valid_seen", "gaca/ALFWorld-v0", {"split": "valid_seen"}),
                       Part("valid_unseen", "gaca/ALFWorld-v0", {"split": "valid_unseen"}))),
    "webshop": Suite("1", "WebShop test goals (500) on the bundled generated catalogue",
                     (Part("test", "gaca/WebShop-v0", {"split": "test"}),)),
    # v2 adds signs (the demo's world); v1 was corridor and slippery
    "diag": Suite("2", "the diagnostic worlds' test tasks (16 each): corridor, signs (the "
                       "demo's world), slippery",
                  (Part("corridor", "gaca/Diag-Corridor-v0", {"split": "test"}),
                   Part("signs", "gaca/Diag-Signs-v0", {"split": "test"}),
                   Part("slippery", "gaca/Diag-Slippery-v0", {"split": "test"}))),
}


def _scienceworld() -> Suite:
    """One part per task type: ``SCIENCEWORLD_EPISODES`` evenly spaced variations of its
    test split (``gaca-eval``'s plan: task ids ``floor(i * n / k)``)."""
    from gaca_envs.scienceworld.tasks import TASK_TYPES

    return Suite("1", f"ScienceWorld test split, {SCIENCEWORLD_EPISODES} evenly spaced "
                      "variations of each of the 30 task types (--episodes all: every one)",
                 tuple(Part(task, "gaca/ScienceWorld-v0", {"split": "test", "task_types": task},
                            str(SCIENCEWORLD_EPISODES)) for task in TASK_TYPES))


#: Test variations per ScienceWorld task type in the ``scienceworld`` suite.
SCIENCEWORLD_EPISODES = 2
SUITES["scienceworld"] = _scienceworld()


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; valid: {sorted(SUITES)}")
    return SUITES[name]


def run_suite(name: str, policy_spec: str, out: Path, episodes: str | int | None = None,
              policy_kwargs: dict | None = None, progress: bool = True, **how: Any) -> str:
    """Evaluate every part into ``out/<part>/`` (``episodes``: each part's own unless
    given; ``how``: :class:`~gaca_agent.eval.evaluate.Evaluation`'s seed, workers and
    max_live_envs); write ``suite.json`` and ``suite.md``."""
    from gaca_agent.eval.evaluate import Evaluation, eval_policy_kwargs, evaluate
    from gaca_agent.policies import make_policy

    suite = get_suite(name)
    policy_kwargs = eval_policy_kwargs(policy_spec, policy_kwargs)
    policy = make_policy(policy_spec, **policy_kwargs)
    rows = {}
    for part in suite.parts:
        res = evaluate(Evaluation(part.env_id, policy_spec, episodes or part.episodes,
                                  part.env_kwargs, policy_kwargs, **how),
                       out / part.name, progress, policy)
        rows[part.name] = {k: res[k] for k in ("n", "failed", "success_rate", "success_ci95",
                                               "mean_score", "mean_steps")}
    table = {"suite": name, "version": suite.version if not episodes else
             f"{suite.version}-episodes-{episodes}", "policy": policy_spec, "parts": rows}
    (out / "suite.json").write_text(json.dumps(table, indent=2))
    md = markdown([table])
    (out / "suite.md").write_text(md + "\n")
    return md


def _load(path: Path) -> dict[str, Any]:
    if (path / "suite.json").exists():
        return json.loads((path / "suite.json").read_text())
    if (path / "results.json").exists():
        r = json.loads((path / "results.json").read_text())
        return {"suite": r["env"], "version": "-", "policy": r["policy"],
                "parts": {"all": {k: r[k] for k in ("n", "failed", "success_rate",
                                                    "success_ci95", "mean_score",
                                                    "mean_steps")}}}
    raise ValueError(f"{path} has neither suite.json nor results.json")


def markdown(tables: list[dict[str, Any]]) -> str:
    """Parts as columns; with more than four parts (ScienceWorld's 30 task types), one
    row per part and one column per table."""
    parts = sorted({p for t in tables for p in t["parts"]})
    if len(parts) > 4:
        return _long_markdown(tables)
    head = "| policy | suite | " + " | ".join(f"{p} success (95% CI) / score" for p in parts) + " |"
    lines = [head, "|---|---|" + "---|" * len(parts)]
    for t in tables:
        cells = [_cell(t["parts"].get(p)) for p in parts]
        lines.append(f"| {t['policy']} | {t['suite']} v{t['version']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return (f"{r['success_rate']:.3f} ({r['success_ci95'][0]:.2f}-{r['success_ci95'][1]:.2f})"
            f" / {r['mean_score']:.3f}, n={r['n']}")


def _long_markdown(tables: list[dict[str, Any]]) -> str:
    order = list(dict.fromkeys(p for t in tables for p in t["parts"]))  # the suite's order
    head = "| part | " + " | ".join(f"{t['policy']} ({t['suite']} v{t['version']}) success "
                                    "(95% CI) / score" for t in tables) + " |"
    lines = [head, "|---|" + "---|" * len(tables)]
    for p in order:
        lines.append(f"| {p} | " + " | ".join(_cell(t["parts"].get(p)) for t in tables) + " |")
    for t in tables:
        done = [r for r in t["parts"].values() if r["n"]]
        if done:
            n = sum(r["n"] for r in done)
            lines.append(f"| all ({t['policy']}) | success "
                         f"{sum(r['success_rate'] * r['n'] for r in done) / n:.3f} / score "
                         f"{sum(r['mean_score'] * r['n'] for r in done) / n:.3f}, n={n} |"
                         + " |" * (len(tables) - 1))
    return "\n".join(lines)


def compare(paths: list[Path]) -> str:
    tables = [_load(p) for p in paths]
    versions = {(t["suite"], t["version"]) for t in tables}
    note = "" if len(versions) <= 1 else "\n(note: different suites or versions side by side)"
    return markdown(tables) + note
