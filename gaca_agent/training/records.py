"""The records of a training iteration's episodes: ``episodes.jsonl`` rows with each
step's advantage and weight, ``train_episodes.jsonl`` and ``train_report.html``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gaca_agent.config import TrainConfig


def episode_records(rollout, tokens: bool = False) -> list[dict[str, Any]]:
    """Episode records (``episodes.jsonl`` form) of a rollout, with each step's advantage
    and weight where :meth:`Rollout.attach` set them (and with ``tokens`` its token ids
    and log-probs)."""
    from gaca_agent.runs.results import episode_record

    return [episode_record(e, ep, rollout.steps(ep, tokens))
            for e, ep in enumerate(rollout.episodes)]


def write_train_report(run_dir: Path, cfg: TrainConfig, iteration: int, records) -> None:
    """``train_episodes.jsonl`` and ``train_report.html``: an iteration's rollouts (the
    main process's share) with each step's advantage and step-level weight as colours."""
    from gaca_agent.runs.report import render_report
    from gaca_agent.runs.results import summarize

    with open(run_dir / "train_episodes.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    meta = {"env": cfg.env.id, "policy": f"{cfg.name} (iteration {iteration}, "
                                         f"{cfg.algo.estimator})"}
    (run_dir / "train_report.html").write_text(render_report(
        summarize(records, meta), records, f"{cfg.name}: training rollouts, iteration {iteration}",
        training=True))

