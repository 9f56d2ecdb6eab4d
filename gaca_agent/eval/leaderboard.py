"""The leaderboard: every policy evaluated on a suite's held-out tasks under one protocol,
with Wilson 95% intervals, from ``gaca-eval`` folders and ``gaca-train`` runs.

    gaca-eval --leaderboard runs/leaderboard runs/cpu_lm_alfworld --out docs/leaderboard.md

A ``gaca-eval`` folder (``config.json`` + ``results.json``) is one row, named by its
policy. A ``gaca-train`` run (``config.yaml`` + ``metrics.jsonl``) gives up to three rows
of its model on its own held-out episodes: zero-shot (``eval_before/*``), after the
warm-up (``eval/*`` of row -1) and after RL (``final_eval/``, else its last evaluation).
Rows are grouped by protocol: env, env kwargs (split, step limit), episodes and seed.
A training run's evaluation plays episode i with seed 10000 + i (``EVAL_SEED``), so a
``gaca-eval`` row with ``--seed 10000``, the same ``--episodes`` and kwargs plays the same
tasks. Any other policy (``openai:URL#MODEL``, ``hf:PATH``) joins a table by being
evaluated under its protocol into a folder the command is given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: Env kwargs that name where data lives, not what is played.
_LOCAL_KWARGS = ("data_dir", "cache_dir")


INTRO = """# Leaderboard

Every policy evaluated on a suite's held-out tasks, one table per protocol (the env, its
kwargs, the episodes and their seeds: every row of a table played the same tasks), best
first, with 95% Wilson intervals. Made by `gaca-eval --leaderboard` (`bash
scripts/leaderboard.sh` runs the baselines and regenerates this page); a training run
adds its model zero-shot, after its warm-up and after RL. Add a model by evaluating it
under a table's protocol ([Evaluating](evaluation.md#the-leaderboard)).

"""


@dataclass(frozen=True)
class Row:
    env: str
    env_kwargs: tuple[tuple[str, str], ...]
    episodes: str
    seed: int
    policy: str
    n: int
    successes: int
    score: float
    format_invalid: float | None
    temperature: float | None
    source: str

    @property
    def protocol(self) -> tuple:
        return self.env, self.env_kwargs, self.episodes, self.seed


def _kwargs(kwargs: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in (kwargs or {}).items()
                        if k not in _LOCAL_KWARGS))


def eval_row(folder: Path, policy: str | None = None) -> Row:
    """The row of a ``gaca-eval`` folder (``policy``: a label in place of its spec)."""
    config = json.loads((folder / "config.json").read_text())
    res = json.loads((folder / "results.json").read_text())
    temperature = (config.get("policy_kwargs") or {}).get("temperature")
    return Row(config["env"], _kwargs(config.get("env_kwargs")), str(config["episodes"]),
               int(config.get("seed", 0)), policy or config["policy"], int(res["n"]),
               round(res["success_rate"] * res["n"]), float(res["mean_score"]),
               res.get("format_invalid_rate"), temperature, str(folder))


def model_name(path: str) -> str:
    """A model as a row names it: a built-in name as is, a folder by its last two parts
    (``cpu_lm_alfworld/warmup``), not this machine's absolute path."""
    parts = Path(path).parts
    return path if len(parts) < 2 else "/".join(parts[-2:])


def train_rows(run: Path) -> list[Row]:
    """The rows of a ``gaca-train`` run: zero-shot, after the warm-up (or, for a run that
    starts from another's warm-up, only before RL), after RL (those it has). A stage's own
    evaluation folder (``zero_shot_eval/``, ``warmup_eval/``, ``final_eval/``) is read
    where the run wrote one, else its metrics row."""
    import yaml

    from gaca_agent.runs.rundir import read_metrics
    from gaca_agent.eval.evaluate import EVAL_SEED

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    env, model = cfg["env"], cfg["model"]
    n = int(env["eval_episodes"])
    common = dict(env=env["id"], env_kwargs=_kwargs(env.get("eval_kwargs") or env["kwargs"]),
                  episodes=str(n), seed=EVAL_SEED, n=n,
                  temperature=model.get("eval_temperature"))
    rows = read_metrics(run)
    warm = next((r for r in rows if r.get("iteration") == -1), {})
    evals = [r for r in rows if r.get("iteration", -1) >= 0 and "eval/success" in r]
    name = f"{model_name(str(model['path']))} {{}} ({run.name})"
    warmed = bool(cfg.get("warmup", {}).get("bc_steps"))
    last = evals[-1] if evals else {}
    found = []
    for label, folder, prefix, row in (
            # without a warm-up, the model before it is the one before RL: rowed once
            *((("zero-shot", "zero_shot_eval", "eval_before", warm),) if warmed else ()),
            ("after warm-up" if warmed else "before RL", "warmup_eval", "eval",
             warm if warmed else {}),
            ("after RL", "final_eval", "eval", last)):
        if (run / folder / "results.json").is_file():  # the run's own record of it
            found.append(replace(eval_row(run / folder, name.format(label)),
                                 temperature=common["temperature"]))
        elif f"{prefix}/success" in row:
            found.append(Row(policy=name.format(label),
                             successes=round(row[f"{prefix}/success"] * n),
                             score=float(row[f"{prefix}/score"]),
                             format_invalid=row.get(f"{prefix}/format_invalid"),
                             source=str(run), **common))
    return found


def collect(paths: list[Path]) -> list[Row]:
    """Rows of every ``gaca-eval`` folder and ``gaca-train`` run at or under ``paths`` (three
    levels down), in the order found; a path that holds neither is an error."""
    rows: list[Row] = []
    for path in paths:
        found = _walk(Path(path), 3)
        if not found:
            raise ValueError(f"{path} holds no gaca-eval results (config.json + results.json) "
                             "and no gaca-train run (config.yaml + metrics.jsonl)")
        rows += found
    return rows


def _walk(path: Path, depth: int) -> list[Row]:
    if (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file():
        return train_rows(path)
    if (path / "config.json").is_file() and (path / "results.json").is_file():
        return [eval_row(path)]
    if depth == 0 or not path.is_dir():
        return []
    return [r for child in sorted(path.iterdir()) for r in _walk(child, depth - 1)]


def markdown(rows: list[Row]) -> str:
    """One table per protocol, its rows by success (then score), best first."""
    from gaca_agent.runs.results import wilson

    tables: dict[tuple, list[Row]] = {}
    for row in rows:
        tables.setdefault(row.protocol, []).append(row)
    lines = []
    heads = [(env, kwargs) for env, kwargs, _, _ in tables]
    for (env, kwargs, episodes, seed), members in tables.items():
        shown = ", ".join(f"{k}={v}" for k, v in kwargs) or "defaults"
        head = f"## {env} ({shown})"
        if heads.count((env, kwargs)) > 1:  # the same suite on other tasks: its own heading
            head += f": {episodes} episodes from seed {seed}"
        lines += [head, "",
                  f"{episodes} episodes, episode i with seed {seed} + i (the same tasks for "
                  "every row).", "",
                  "| policy | success (Wilson 95%) | mean score | format-invalid | "
                  "temperature | source |", "|---|---|---|---|---|---|"]
        for r in sorted(members, key=lambda r: (-r.successes / max(r.n, 1), -r.score)):
            low, high = wilson(r.successes, r.n)
            invalid = "-" if r.format_invalid is None else f"{r.format_invalid:.0%}"
            temp = "-" if r.temperature is None else f"{r.temperature:g}"
            lines.append(f"| {r.policy} | {r.successes} / {r.n} ({low:.2f}-{high:.2f}) | "
                         f"{r.score:.3f} | {invalid} | {temp} | `{r.source}` |")
        lines.append("")
    return "\n".join(lines)


def write(paths: list[Path], out: Path | None) -> str:
    """The leaderboard of ``paths`` as Markdown, also written to ``out`` when given."""
    text = INTRO + markdown(collect(paths))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text
