"""``gaca-audit``: how good are observation-text anchors, measured against the true state.

    gaca-audit runs/eval/alf-random            # a gaca-eval folder (episodes.jsonl)
    gaca-audit runs/default                    # a training run (rollouts/*.jsonl.gz)
    gaca-audit a/episodes.jsonl b/ --similarity 0.9 --out runs/audit

Step-level estimators pool the returns of the rows of one task group that share an
anchor. Three anchor definitions are compared, each within a task group:

- ``state``: the canonical state key (the environment's true state; ours);
- ``text``: the exact observation text (GiGPO's);
- ``similar@T``: observation texts with difflib similarity >= T clustered together
  (GiGPO's optional similarity grouping; greedy, first member as representative).

Per environment and task type (and overall): the share of step rows in singleton anchor
groups, the mean anchor-group size, the **alias rate** (anchor groups that merge rows whose
canonical states differ: the share of such groups among groups of 2 or more, and the share
of step rows in them) and the **split rate** (canonical states whose rows fall into more
than one anchor group: the share of states seen twice or more, and of their rows).
``state`` has alias and split 0 by construction. Writes ``audit.json``, ``audit.md`` and
``audit.png``. Episodes need task groups of several rollouts (``gaca-eval --group-size``
or training rollouts); failed episodes are left out.
"""

from __future__ import annotations

import difflib
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from gaca_agent.runs.plots import figure


def episode_files(path: Path) -> list[Path]:
    """The episode files under ``path`` (a file, an eval or suite folder, or a run)."""
    from gaca_agent.runs.exported import is_export

    if path.is_file() or is_export(path):
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    found = sorted(path.glob("rollouts/*.jsonl.gz")) or sorted(path.glob("episodes.jsonl")) \
        or sorted(path.glob("*/episodes.jsonl")) or sorted(path.glob("train_episodes.jsonl"))
    if not found:
        raise FileNotFoundError(f"{path} holds no episodes.jsonl, rollouts/*.jsonl.gz or "
                                "train_episodes.jsonl")
    return found


def env_of(file: Path) -> str:
    """The env id an episode file came from (its folder's config), else the folder name."""
    from gaca_agent.runs.exported import export_source, is_export

    if is_export(file):
        return export_source(file)["env"] or file.name
    for folder in (file.parent, file.parent.parent):
        if (folder / "config.json").is_file():
            return json.loads((folder / "config.json").read_text()).get("env", folder.name)
        if (folder / "config.yaml").is_file():
            import yaml

            return (yaml.safe_load((folder / "config.yaml").read_text()) or {}).get(
                "env", {}).get("id", folder.name)
    return file.parent.name


def read_records(file: Path) -> Iterable[dict[str, Any]]:
    """The episode records of an episode file, or of a ``gaca-export`` folder."""
    from gaca_agent.runs.exported import is_export, read_export

    if is_export(file):
        yield from read_export(file)
        return
    opener = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rt") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a partial last line


def load_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Step rows (env, task type, group, canonical key, observation) of every
    non-failed episode; a group is one task group of one file (and iteration)."""
    rows = []
    for n, file in enumerate(f for p in paths for f in episode_files(p)):
        env = env_of(file)
        for record in read_records(file):
            if record.get("failed"):
                continue
            group = (n, record.get("group", record["index"]))
            traj = record.get("traj", record["index"])
            for step in record["trajectory"]:
                rows.append({"env": env, "task_type": record.get("task_type") or "all",
                             "group": group, "traj": traj, "state": step["state_key"],
                             "text": step["observation"]})
    return rows


def lone_rollouts(rows: list[dict[str, Any]]) -> str | None:
    """Why these rows cannot be audited or re-scored when every task group holds one
    rollout (anchor groups and group baselines compare rollouts of one task), else None."""
    trajs: dict[Any, set] = defaultdict(set)
    for r in rows:
        trajs[r["group"]].add(r["traj"])
    if trajs and all(len(t) == 1 for t in trajs.values()):
        return (f"every one of the {len(trajs)} task groups holds one rollout: anchor groups "
                "and group baselines need several rollouts of each task (gaca-eval "
                "--group-size 8, or a training run's rollouts/)")
    return None


def similar_clusters(texts: list[str], threshold: float) -> list[int]:
    """Greedy clusters of texts (difflib ratio >= threshold to a cluster's first text)."""
    reps: list[str] = []
    out, cache = [], {}
    for text in texts:
        if text not in cache:
            for c, rep in enumerate(reps):
                if difflib.SequenceMatcher(None, rep, text).ratio() >= threshold:
                    cache[text] = c
                    break
            else:
                cache[text] = len(reps)
                reps.append(text)
        out.append(cache[text])
    return out


def anchors(rows: list[dict[str, Any]], definition: str, threshold: float) -> list[tuple]:
    """The anchor group of each row under ``definition`` (within its task group)."""
    if definition == "state":
        return [(r["group"], r["state"]) for r in rows]
    if definition == "text":
        return [(r["group"], r["text"]) for r in rows]
    by_group: dict[Any, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_group[r["group"]].append(i)
    out: list[tuple] = [()] * len(rows)
    for group, idx in by_group.items():
        for i, c in zip(idx, similar_clusters([rows[i]["text"] for i in idx], threshold)):
            out[i] = (group, c)
    return out


def measure(rows: list[dict[str, Any]], anchor_ids: list[tuple]) -> dict[str, float]:
    """Singleton share, mean anchor-group size, alias and split rates of one definition."""
    members: dict[tuple, list[int]] = defaultdict(list)
    for i, a in enumerate(anchor_ids):
        members[a].append(i)
    states: dict[tuple, set] = defaultdict(set)  # (group, canonical state) -> anchors
    state_rows: dict[tuple, int] = defaultdict(int)
    for r, a in zip(rows, anchor_ids):
        states[(r["group"], r["state"])].add(a)
        state_rows[(r["group"], r["state"])] += 1
    multi = [m for m in members.values() if len(m) >= 2]
    aliased = [m for m in multi if len({rows[i]["state"] for i in m}) > 1]
    seen_twice = [k for k, n in state_rows.items() if n >= 2]
    split = [k for k in seen_twice if len(states[k]) > 1]
    n = max(len(rows), 1)
    return {
        "rows": len(rows), "anchor_groups": len(members),
        "singleton_frac": sum(len(m) == 1 for m in members.values()) / n,
        "mean_group_size": len(rows) / max(len(members), 1),
        "alias_rate": len(aliased) / max(len(multi), 1),
        "alias_row_share": sum(len(m) for m in aliased) / n,
        "split_rate": len(split) / max(len(seen_twice), 1),
        "split_row_share": sum(state_rows[k] for k in split) / n,
    }


def audit(rows: list[dict[str, Any]], similarity: float = 0.9) -> dict[str, Any]:
    """Every definition's measures, per env and task type, and per env overall."""
    definitions = {"state": "state", "text": "text", f"similar@{similarity:g}": "similar"}
    blocks: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        blocks[(r["env"], "all")].append(i)
        if r["task_type"] != "all":
            blocks[(r["env"], r["task_type"])].append(i)
    out: dict[str, Any] = {}
    for (env, task_type), idx in sorted(blocks.items()):
        subset = [rows[i] for i in idx]
        out.setdefault(env, {})[task_type] = {
            label: measure(subset, anchors(subset, kind, similarity))
            for label, kind in definitions.items()}
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = ["| env | task type | anchor | rows | singleton | mean group | alias (groups / rows) "
             "| split (states / rows) |", "|---|---|---|---|---|---|---|---|"]
    for env, types in result.items():
        for task_type, defs in sorted(types.items(), key=lambda kv: (kv[0] != "all", kv[0])):
            for d, m in defs.items():
                lines.append(f"| {env} | {task_type} | {d} | {m['rows']} | "
                             f"{m['singleton_frac']:.3f} | {m['mean_group_size']:.2f} | "
                             f"{m['alias_rate']:.3f} / {m['alias_row_share']:.3f} | "
                             f"{m['split_rate']:.3f} / {m['split_row_share']:.3f} |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    labels, alias, split = [], defaultdict(list), defaultdict(list)
    for env, types in result.items():
        for task_type, defs in sorted(types.items()):
            labels.append(f"{env.split('/')[-1]}\n{task_type}"[:40])
            for d, m in defs.items():
                alias[d].append(m["alias_row_share"])
                split[d].append(m["split_row_share"])
    size = (max(8, 1.2 * len(labels)), 4.5)
    with figure(path, 1, 2, figsize=size, sharey=True) as (fig, axes):
        width = 0.8 / max(len(alias), 1)
        for ax, data, title in ((axes[0], alias, "rows in aliased anchor groups"),
                                (axes[1], split, "rows of split canonical states")):
            for k, (d, values) in enumerate(data.items()):
                ax.bar([i + k * width for i in range(len(labels))], values, width, label=d)
            ax.set_xticks([i + width for i in range(len(labels))], labels, rotation=60,
                          ha="right", fontsize=7)
            ax.set_title(title)
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("share of step rows")
        axes[0].legend(fontsize=8)
    return path
