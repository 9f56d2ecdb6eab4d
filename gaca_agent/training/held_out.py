"""Held-out success during training: the evaluation episodes (gaca-eval's plan, its seed)
played by the current weights, each rank its share, reduced to ``eval/*``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gaca_agent.config import TrainConfig
from gaca_agent.training.ranks import rank_share, reduce_sums, rollout_metrics, rollout_sums
from gaca_agent.training.records import episode_records


class HeldOut:
    """One held-out evaluation (the evaluation episodes, the final evaluation's), each
    rank playing its share: ``mine`` (indices into the plan) and their ``rollout``."""

    def __init__(self, learner, policy, collector, cfg: TrainConfig, num_tasks: int) -> None:
        from gaca_agent.eval.evaluate import EVAL_SEED, plan

        self.acc, self.cfg = learner.accelerator, cfg
        tasks = plan(cfg.env.eval_episodes, num_tasks, EVAL_SEED)
        self.mine = rank_share(len(tasks), self.acc)
        with learner.rollout_context():
            self.rollout = collector.run(policy, [tasks[i] for i in self.mine], 1)

    def metrics(self) -> dict[str, float]:
        """``eval/*``: held-out success, score, length and invalid answers (all ranks)."""
        return rollout_metrics(reduce_sums(self.acc, rollout_sums(self.rollout)), "eval")

    def records(self) -> list[dict[str, Any]]:
        """This rank's episode records, indexed as in the plan."""
        records = episode_records(self.rollout)
        for record in records:  # local episode -> the plan's episode index
            record["index"] = self.mine[record["index"]]
        return records

    def write(self, out: Path, label: str) -> None:
        """Every rank's episodes, written by the main process as gaca-eval writes an
        evaluation (``config.json`` with the plan, ``episodes.jsonl``, ``results.json``,
        ``report.html``): ``gaca-eval --compare`` pairs two of a run's evaluations, or one
        with a gaca-eval run of the same plan. Every rank calls it."""
        from accelerate.utils import gather_object

        from gaca_agent.eval.evaluate import EVAL_SEED, Evaluation, write_evaluation

        records = gather_object(self.records())
        if self.acc.is_main_process:
            env = self.cfg.env
            meta = Evaluation(env.id, label, env.eval_episodes, dict(env.eval_kwargs),
                              seed=EVAL_SEED).meta()
            write_evaluation(out, {r["index"]: r for r in records}, meta, label, env.id)
