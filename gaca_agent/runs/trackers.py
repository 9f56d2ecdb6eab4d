"""Where a run's metrics go besides ``metrics.jsonl``: TensorBoard, Weights & Biases,
Trackio (any subset; config key ``logging``), under the same metric names.

Each tracker logs a metric at step ``iteration + 1`` (the warm-up, iteration -1, is step
0) with ``iteration`` beside it. W&B gets the run's config and records the git commit as
it does for any run in a git checkout; ``WANDB_MODE=offline`` keeps it local. Trackio
writes to its local store (``TRACKIO_DIR``). A resumed run continues the same W&B run
(its id is kept in ``wandb_id`` in the run folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

class Tracker:
    def log(self, metrics: dict[str, float], step: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    def __init__(self, run_dir: Path, **_: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step - 1)  # TensorBoard keeps the iteration
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB(Tracker):
    def __init__(self, run_dir: Path, name: str, project: str, config: dict) -> None:
        import uuid

        import wandb

        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow",
                              config=config, dir=str(run_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, "iteration": step - 1}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio(Tracker):
    def __init__(self, run_dir: Path, name: str, project: str, config: dict) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=project, name=name, config=config, resume="allow")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.trackio.log({**metrics, "iteration": step - 1}, step=step)

    def close(self) -> None:
        self.trackio.finish()


KINDS = {"tensorboard": TensorBoard, "wandb": WandB, "trackio": Trackio}


def open_trackers(kinds: tuple[str, ...], run_dir: Path, name: str, project: str,
                  config: dict) -> list[Tracker]:
    """The trackers of ``kinds`` (each named as its package; ``check_config`` refuses a
    missing one before the run starts)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown tracker(s) {unknown}; valid: {list(KINDS)}")
    return [KINDS[k](run_dir, name=name, project=project, config=config) for k in kinds]
