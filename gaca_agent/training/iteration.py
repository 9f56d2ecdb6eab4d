"""The pieces of a training iteration: its task groups, the rank-global ids, the
advantages over every rank's rows, the reduced rollout metrics, held-out success and the
episode records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gaca_agent.config import TrainConfig



def iteration_tasks(cfg: TrainConfig, iteration: int,
                    num_tasks: int | None) -> list[tuple[int, int]]:
    """(task id, seed) of the iteration's groups; an env without ``num_tasks`` (``None``)
    gets task ids 0.. and differs by seed alone."""
    rng = np.random.default_rng([cfg.seed, iteration])
    ids = (rng.choice(num_tasks, size=cfg.env.groups, replace=cfg.env.groups > num_tasks)
           if num_tasks is not None else np.arange(cfg.env.groups))
    seeds = rng.integers(0, 2**31 - 1, size=cfg.env.groups)
    return [(int(t), int(s)) for t, s in zip(ids, seeds)]


def rank_share(n: int, acc) -> list[int]:
    """The indices of ``n`` items (task groups, episodes) this rank plays: every
    ``num_processes``-th one from its own index."""
    return list(range(acc.process_index, n, acc.num_processes))


def drop_stale(rollout, iteration: int, staleness: int) -> int:
    """Mark failed (so they are not trained on) the episodes of every task group with a
    step sampled more than ``staleness`` versions before ``iteration``; how many groups.
    (The producer's schedule never lets that happen; this is the guard behind it.)"""
    table = rollout.table
    old = table["policy_version"] < iteration - staleness
    stale = set(table["group"][old & (table["policy_version"] >= 0)].tolist())
    for ep in rollout.episodes:
        if ep.group in stale and not ep.failed:
            ep.failed, ep.error = True, (f"dropped: sampled more than {staleness} weight "
                                         f"versions before update {iteration}")
    if stale:
        table.columns["failed"] = table["failed"] | np.isin(table["group"], list(stale))
    return len(stale)


def staleness_metrics(acc, table, iteration: int, dropped: int,
                      waited_s: float) -> dict[str, float]:
    """How many versions behind the learner the trained tokens were sampled (min, mean
    over tokens, max; over every rank), task groups dropped, and the learner's wait."""
    import torch

    behind = iteration - table["policy_version"]
    tokens = table["completion_ids"].lengths().astype(np.float64)
    known = table["policy_version"] >= 0
    values = [float((behind * tokens)[known].sum()), float(tokens[known].sum()),
              float(dropped), waited_s]
    low = float(behind[known].min()) if known.any() else float("inf")
    high = float(behind[known].max()) if known.any() else float("-inf")
    if acc.num_processes > 1:
        t = torch.tensor(values, dtype=torch.float64, device=acc.device)
        values = acc.reduce(t, reduction="sum").tolist()
        ends = acc.gather(torch.tensor([[low, high]], dtype=torch.float64, device=acc.device))
        low, high = float(ends[:, 0].min()), float(ends[:, 1].max())
    weighted, n, dropped_all, waited = values
    return {"async/stale_min": low if n else 0.0, "async/stale_max": high if n else 0.0,
            "async/stale_mean": weighted / n if n else 0.0,
            "async/dropped_groups": dropped_all,
            "async/wait_s": waited / max(acc.num_processes, 1)}


def globalize(rollout, mine: list[int], group_size: int) -> None:
    """Local task-group and trajectory ids of a rank's rollout -> the iteration's ids."""
    groups = np.asarray(mine, dtype=np.int64)
    for ep in rollout.episodes:
        ep.traj = mine[ep.group] * group_size + ep.traj % group_size
        ep.group = mine[ep.group]
    cols = rollout.table.columns
    cols["traj"] = groups[cols["group"]] * group_size + cols["traj"] % group_size
    cols["group"] = groups[cols["group"]]


def rollout_sums(rollout) -> dict[str, float]:
    """Sums and counts of a rollout (reduced over ranks before dividing)."""
    done = [e for e in rollout.episodes if not e.failed]
    ok = ~rollout.table["failed"]
    return {"episodes": len(done), "won": sum(e.won for e in done),
            "score": sum(e.score for e in done), "return": sum(e.total_reward for e in done),
            "length": sum(e.length for e in done), "steps": float(ok.sum()),
            "format_invalid": float((~rollout.table["format_valid"][ok]).sum()),
            "failed": sum(e.failed for e in rollout.episodes)}


def reduce_sums(acc, sums: dict[str, float]) -> dict[str, float]:
    import torch

    keys = sorted(sums)
    t = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=acc.device)
    if acc.num_processes > 1:
        t = acc.reduce(t, reduction="sum")
    return dict(zip(keys, t.tolist()))


def rollout_metrics(s: dict[str, float], prefix: str = "rollout") -> dict[str, float]:
    n = max(s["episodes"], 1.0)
    out = {f"{prefix}/success": s["won"] / n, f"{prefix}/score": s["score"] / n,
           f"{prefix}/length": s["length"] / n,
           f"{prefix}/format_invalid": s["format_invalid"] / max(s["steps"], 1.0)}
    if prefix == "rollout":
        out.update({"rollout/return": s["return"] / n, "rollout/failed": s["failed"]})
    return out


def estimate(acc, cfg: TrainConfig, table):
    """Advantages of this rank's rows, computed on the gathered scalar columns of every
    rank (group statistics span ranks); returns (advantages, diagnostics, step weights)."""
    from accelerate.utils import gather_object

    from gaca_agent.advantages import compute
    from gaca_agent.steps import StepTable, step_batch

    needs_text = cfg.algo.params.get("similarity") is not None
    parts = gather_object([table.scalars(with_observation=needs_text, anchor=cfg.algo.anchor)])
    batch = step_batch(StepTable.concat(parts))
    adv, diag, rows = compute(cfg.algo.estimator, batch, details=True, **cfg.algo.params)
    start = sum(len(p) for p in parts[:acc.process_index])
    mine = slice(start, start + len(table))
    return adv[mine], diag, rows["weight"][mine]


class HeldOut:
    """One held-out evaluation (the evaluation episodes, the final evaluation's), each
    rank playing its share: ``mine`` (indices into the plan) and their ``rollout``."""

    def __init__(self, learner, policy, collector, cfg: TrainConfig, num_tasks: int) -> None:
        from gaca_agent.eval.evaluate import EVAL_SEED, plan

        self.acc = learner.accelerator
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


def held_out(learner, policy, collector, cfg: TrainConfig, num_tasks: int) -> dict[str, float]:
    """Held-out success on the evaluation episodes (see :class:`HeldOut`)."""
    return HeldOut(learner, policy, collector, cfg, num_tasks).metrics()


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
