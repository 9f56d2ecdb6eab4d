"""An iteration spread over the ranks and gathered back: its task groups, each rank's
share, rank-global ids, the advantages over every rank's rows and the rows the update
trains on, the rollout metrics summed over ranks; a hash of a model state that ranks in
sync agree on."""

from __future__ import annotations

from dataclasses import dataclass

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
    rank (group statistics span ranks); returns (advantages, diagnostics, step weights,
    the rows to train on: every row, or with ``algo.filter_groups`` those of the groups
    whose returns differ, the same choice on every rank)."""
    from accelerate.utils import gather_object

    from gaca_agent.advantages import compute
    from gaca_agent.advantages.batch import rows_of_groups_with_spread
    from gaca_agent.steps import StepTable, step_batch

    needs_text = cfg.algo.params.get("similarity") is not None
    parts = gather_object([table.scalars(with_observation=needs_text, anchor=cfg.algo.anchor)])
    batch = step_batch(StepTable.concat(parts))
    adv, diag, rows = compute(cfg.algo.estimator, batch, details=True, **cfg.algo.params)
    keep = (rows_of_groups_with_spread(batch) if cfg.algo.filter_groups
            else np.ones(len(adv), dtype=bool))
    start = sum(len(p) for p in parts[:acc.process_index])
    mine = slice(start, start + len(table))
    return adv[mine], diag, rows["weight"][mine], Kept(keep[mine], int(keep.sum()), len(keep))


@dataclass(frozen=True)
class Kept:
    """The rows an update trains on: this rank's mask, and the count over every rank."""

    mask: np.ndarray
    total: int
    of: int

    @property
    def metrics(self) -> dict[str, float]:
        return {"train/filtered_rows_frac": 1.0 - self.total / max(self.of, 1)}


def train_on(learner, table, adv, kept: Kept) -> dict[str, float]:
    """The update on the kept rows; none when no rank kept one (an optimizer step on no
    gradient would still move the weights by Adam's momentum)."""
    if kept.total == 0:
        return {"train/tokens": 0.0, "train/opt_steps": 0.0, **kept.metrics}
    if kept.total < kept.of:
        rows = np.flatnonzero(kept.mask)
        table, adv = table.take(rows), adv[rows]
    return {**learner.update(table, adv), **kept.metrics}


def param_digest(state: dict) -> str:
    """A hash of a model state (equal on every rank when the ranks are in sync)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
