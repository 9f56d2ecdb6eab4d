"""What ``gaca-view`` reads: run and evaluation folders under a root, from stored files only.

A **run** is a folder with ``metrics.jsonl`` or ``rollouts/`` (``gaca-train``); an
**evaluation** one with ``episodes.jsonl`` (``gaca-eval``, a run's ``eval_*`` folders).
Folders are named by their path under the root. Parsed episode files are cached by
(path, size, mtime), so a file still being written is read again once it changes, and a
150-iteration run costs one file read per iteration shown. Nothing here imports training
code: the estimators load only when a comparison is asked for (:mod:`credit`).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from gaca_agent.analysis.audit import read_records
from gaca_agent.analysis.rescore import source_files
from gaca_agent.runs.rundir import read_metrics

LIVE_S = 120.0  # a run whose metrics changed this recently is shown as running
_CACHE: OrderedDict[tuple, list[dict[str, Any]]] = OrderedDict()
_CACHE_SIZE = 8


class NotFound(ValueError):
    """A folder, iteration or step the request names does not exist."""


def kind_of(folder: Path) -> str | None:
    if (folder / "metrics.jsonl").is_file() or (folder / "rollouts").is_dir():
        return "run"
    if (folder / "episodes.jsonl").is_file():
        return "eval"
    return None


def discover(root: Path, depth: int = 3) -> list[tuple[str, str]]:
    """(name, kind) of every run and evaluation at most ``depth`` folders below ``root``."""
    found, frontier = [], [root]
    for _ in range(depth + 1):
        nxt = []
        for folder in frontier:
            kind = kind_of(folder)
            if kind:
                found.append((_name(root, folder), kind))
            if kind != "eval":
                nxt += sorted(p for p in folder.iterdir() if p.is_dir() and
                              p.name not in ("rollouts", "checkpoints", "tensorboard",
                                             "reference", "warmup", "final"))
        frontier = nxt
    return found


def _name(root: Path, folder: Path) -> str:
    rel = folder.relative_to(root).as_posix()
    return "." if rel == "." else rel


def resolve(root: Path, name: str) -> Path:
    """The folder ``name`` names under ``root`` (never outside it)."""
    folder = (root / name).resolve()
    if folder != root.resolve() and root.resolve() not in folder.parents:
        raise NotFound(f"{name!r} is outside the viewed folder")
    if not folder.is_dir() or kind_of(folder) is None:
        raise NotFound(f"{name!r} is not a run or an evaluation under {root}")
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config (a run's ``config.yaml``, an evaluation's ``config.json``)."""
    try:
        if (folder / "config.yaml").is_file():
            import yaml

            return yaml.safe_load((folder / "config.yaml").read_text()) or {}
        if (folder / "config.json").is_file():
            return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return {"_error": f"config unreadable: {e}"}
    return {}


def summary(root: Path, name: str, kind: str) -> dict[str, Any]:
    folder = root / name
    cfg = read_config(folder)
    env = cfg.get("env")
    out: dict[str, Any] = {"name": name, "kind": kind,
                           "env": env.get("id") if isinstance(env, dict) else env,
                           "error": cfg.get("_error")}
    if kind == "run":
        metrics = read_metrics(folder)
        out.update(estimator=(cfg.get("algo") or {}).get("estimator"),
                   model=(cfg.get("model") or {}).get("path"),
                   planned=cfg.get("iterations"), iterations=len(iterations(folder)),
                   status=run_status(folder, metrics, cfg),
                   last={k: v for k, v in (metrics[-1] if metrics else {}).items()
                         if k in ("iteration", "rollout/success", "eval/success")})
    else:
        results = folder / "results.json"
        try:
            res = json.loads(results.read_text()) if results.is_file() else {}
        except ValueError:
            res = {}
        out.update(env=out["env"] or res.get("env"), policy=cfg.get("policy", res.get("policy")),
                   episodes=res.get("n"), success=res.get("success_rate"),
                   status="done" if res.get("complete") else "partial")
    return out


def run_status(folder: Path, metrics: list[dict[str, Any]], cfg: dict[str, Any]) -> str:
    done = [m["iteration"] for m in metrics if isinstance(m.get("iteration"), int)]
    if cfg.get("iterations") is not None and done and max(done) >= cfg["iterations"] - 1:
        return "finished"
    mtime = (folder / "metrics.jsonl").stat().st_mtime if (folder / "metrics.jsonl"
                                                            ).exists() else 0
    return "running" if time.time() - mtime < LIVE_S else "stopped"


def iterations(folder: Path) -> list[int]:
    """The iterations whose rollouts the run kept (``-1``: an evaluation's one batch)."""
    return sorted({it for it, _ in _found(folder)})


def _found(folder: Path) -> list[tuple[int, Path]]:
    try:
        return source_files(folder)[0]
    except FileNotFoundError:  # a run that kept no rollouts
        return []


def episode_files(folder: Path, iteration: int) -> list[Path]:
    if iteration == -1 and kind_of(folder) != "eval":
        raise NotFound(f"{folder.name} is a run: name an iteration")
    files = [f for it, f in _found(folder) if it == iteration]
    if not files:
        raise NotFound(f"{folder.name} kept no rollouts of iteration {iteration}")
    return files


def episodes(folder: Path, iteration: int) -> list[dict[str, Any]]:
    """The episode records of one iteration (or evaluation), each with its ``traj`` (an
    evaluation's: its index), every rank's file together."""
    files = episode_files(folder, iteration)
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    out = []
    for f in files:
        for record in read_records(f):
            record["traj"] = record["index"] if iteration == -1 else \
                record.get("traj", record["index"])
            out.append(record)
    if iteration == -1:  # an evaluation may hold an episode twice (resumed): the latest
        out = list({r["index"]: r for r in out}.values())
    _CACHE[key] = out
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out
