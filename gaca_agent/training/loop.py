"""The training loop: warm-up, then per iteration collect, estimate, update, sync, log,
evaluate and checkpoint; the final save and held-out evaluation. See
:mod:`gaca_agent.cli.train` for the files a run writes."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import yaml

from gaca_agent.config import TrainConfig, to_dict
from gaca_agent.eval.evaluate import num_tasks_of, plan
from gaca_agent.runs.progress import (iteration_line, quiet_libraries, warmup_line,
                                      warmup_progress)
from gaca_agent.runs.rundir import (MetricsLog, latest_checkpoint, resume_hint, save_checkpoint,
                                    write_atomic, write_rollouts)
from gaca_agent.training.build import (load_adapter, make_collector, make_policies, place_servers,
                                       resolve_model)
from gaca_agent.training.held_out import HeldOut
from gaca_agent.training.producer import (Batch, Lockstep, Producer, Schedule, load_ahead,
                                          save_ahead)
from gaca_agent.training.ranks import (estimate, globalize, iteration_tasks, param_digest,
                                       rank_share, reduce_sums, rollout_metrics, rollout_sums,
                                       train_on)
from gaca_agent.training.records import episode_records, write_train_report
from gaca_agent.training.sync import WeightSync

if TYPE_CHECKING:  # the heavy classes, for the Run's fields only
    from accelerate import Accelerator
    from transformers import PreTrainedTokenizerBase

    from gaca_agent.cluster.servers import Fleet
    from gaca_agent.collect.collector import Collector
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.server_group import ServerGroup
    from gaca_agent.learner.core import Learner
    from gaca_agent.policies.hf import HFPolicy
    from gaca_agent.policies.served import ServerPolicy


class RunExists(ValueError):
    """The run directory already holds a run (resume it, or choose another name)."""


def refuse_existing(run_dir: Path) -> None:
    """Raise :class:`RunExists` when ``run_dir`` holds a run."""
    if (run_dir / "metrics.jsonl").exists():
        raise RunExists(f"{run_dir} already holds a run: --resume it or choose another name")


class TrainingStopped(RuntimeError):
    """A run stopped by a fault (an env or inference server gone, a checkpoint that could
    not be written): says which, and what ``--resume`` continues from."""

    def __init__(self, run_dir: Path, stage: str, error: BaseException) -> None:
        super().__init__(f"{stage} stopped: {type(error).__name__}: {error}; "
                         f"{resume_hint(run_dir)}")
        self.run_dir, self.latest, self.error = run_dir, latest_checkpoint(run_dir), error


@dataclass
class Run:
    """Everything one training run holds while it runs."""

    cfg: TrainConfig
    acc: Accelerator
    run_dir: Path
    learner: Learner
    tokenizer: PreTrainedTokenizerBase
    log: MetricsLog
    start: int
    policy: HFPolicy | ServerPolicy | None = None
    eval_policy: HFPolicy | ServerPolicy | None = None
    server: ServerEngine | ServerGroup | None = None
    """The inference server's client (``model.engine: server``)."""
    fleet: Fleet | None = None
    """The inference servers Ray started for the run (``cluster.servers``)."""
    collector: Collector | None = None
    evaluator: Collector | None = None
    sync: WeightSync | None = None
    source: Lockstep | Producer | None = None
    """Where batches come from: :class:`Lockstep` or a :class:`Producer` running ahead."""
    ahead: list = field(default_factory=list)
    """A resumed asynchronous run's batches collected before its checkpoint."""
    n_train: int = 0
    n_eval: int = 0
    busy: float = 0.0
    """The server engine's busy seconds up to the last iteration."""
    final_eval: HeldOut | None = None
    """The last iteration's held-out evaluation (of the final weights), reused by the final
    evaluation instead of playing the same episodes again."""

    def close(self) -> None:
        for part in (self.source, self.sync, self.collector, self.evaluator, self.server,
                     self.fleet, self.log):
            if part is not None:
                part.close()


def train(cfg: TrainConfig, resume: Path | None = None, progress: bool = True) -> Path:
    """Run (or resume, from ``resume``'s latest checkpoint) ``cfg``; the run directory.
    With ``progress`` and a terminal, a progress bar; else one plain line per iteration
    on stdout (the main process's)."""
    from tqdm import tqdm

    quiet_libraries()
    run = _open(cfg, resume)
    bar_shown = progress and sys.stderr.isatty()
    stage = "the warm-up"
    try:
        if run.start == 0:
            _warmup(run, bar_shown)
        elif run.sync is not None:
            run.sync(run.start)  # a resumed run first puts its checkpoint's weights there
        run.source = _source(run)
        bar = tqdm(range(run.start, cfg.iterations), desc=cfg.name,
                   disable=not (bar_shown and run.acc.is_main_process))
        for it in bar:
            stage = f"iteration {it + 1}/{cfg.iterations}"
            t0 = time.perf_counter()
            metrics = learn(run, it, run.source.get(it), t0)
            bar.set_postfix(success=f"{metrics['rollout/success']:.2f}",
                            eval=f"{metrics.get('eval/success', float('nan')):.2f}")
            if not bar_shown and run.acc.is_main_process:
                print(iteration_line(cfg.name, it, cfg.iterations, metrics,
                                     time.perf_counter() - t0), flush=True)
        stage = "the final save and evaluation"
        _finish(run)
    except Exception as err:
        raise TrainingStopped(run.run_dir, stage, err) from err
    finally:
        run.close()
    run.acc.end_training()
    return run.run_dir


def _open(cfg: TrainConfig, resume: Path | None) -> Run:
    """The run directory, learner (restored from the latest checkpoint when resuming),
    policies, collectors and weight sync of a run."""
    import torch
    from transformers import AutoTokenizer

    from gaca_agent.learner.accelerator import make_accelerator
    from gaca_agent.learner.core import Learner

    acc = make_accelerator()
    run_dir = resume or Path(cfg.out_dir) / cfg.name
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume is None:
        refuse_existing(run_dir)
    if acc.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    acc.wait_for_everyone()
    torch.manual_seed(cfg.seed)
    base = resolve_model(cfg, acc)
    torch.manual_seed(cfg.seed)  # building the tiny model the first time draws from torch
    tokenizer = AutoTokenizer.from_pretrained(base)
    weights = str(ckpt[1] / "model") if ckpt and cfg.learner.lora_r == 0 else base
    # a resumed run keeps the reference the warm-up made (not the checkpoint's weights;
    # reference/: where runs before warmup/ kept it)
    reference = next((d for d in (run_dir / "warmup", run_dir / "reference")
                      if (d / "config.json").exists()), base) if ckpt else None
    learner = Learner(weights, tokenizer, cfg.learner, acc, reference=reference)
    ahead: list = []
    if ckpt:
        if cfg.learner.lora_r > 0:
            load_adapter(learner, ckpt[1])
        learner.load_state(ckpt[1])
        ahead = load_ahead(ckpt[1], acc.process_index)
    # resuming a run killed before its first checkpoint starts over: drop its metrics
    log = MetricsLog(run_dir, acc.is_main_process, ckpt[0] if ckpt else (-2 if resume else None),
                     cfg.logging, cfg.name, cfg.project, to_dict(cfg))
    run = Run(cfg, acc, run_dir, learner, tokenizer, log, ckpt[0] + 1 if ckpt else 0,
              ahead=ahead)
    run.fleet, served = place_servers(cfg, base, acc)  # cluster.servers: started by Ray
    run.policy, run.eval_policy, run.server = make_policies(served, learner, tokenizer)
    run.n_train = num_tasks_of(cfg.env.id, cfg.env.kwargs, cfg.env.servers)
    run.n_eval = num_tasks_of(cfg.env.id, cfg.env.eval_kwargs, cfg.env.servers)
    run.collector = make_collector(cfg, cfg.env.kwargs)
    run.evaluator = make_collector(cfg, cfg.env.eval_kwargs)  # one for every evaluation
    if run.server is not None:
        run.sync = WeightSync(learner, run.server, run_dir, cfg.name, served.server,
                              cfg.model.temperature, cfg.model.eval_temperature,
                              keep=Schedule(cfg.max_staleness).served, fleet=run.fleet)
    return run


def _source(run: Run):
    """Lock-step, or a producer running ``max_staleness`` iterations ahead."""
    cfg = run.cfg
    if cfg.max_staleness == 0:
        return Lockstep(lambda it, version: collect(run, it, version))
    return Producer(lambda it, version: collect(run, it, version, seed_torch=False),
                    run.start, cfg.iterations, cfg.max_staleness, synced=run.start,
                    pinned=not cfg.partial_rollouts, drain=cfg.learner.lora_r == 0,
                    ready=run.ahead)


def collect(run: Run, it: int, version: int | None = None, seed_torch: bool = True) -> Batch:
    """Iteration ``it``'s rollouts (this rank's share of its task groups), every turn
    pinned to weight version ``version`` when given (else: the current weights, ``it``)."""
    cfg, acc, learner = run.cfg, run.acc, run.learner
    if seed_torch:  # the lock-step order: a local engine's unkeyed rows draw from it
        seed_update(run, it)
    tasks = iteration_tasks(cfg, it, run.n_train)
    mine = rank_share(len(tasks), acc)
    t0 = time.perf_counter()
    # the server engine samples elsewhere: only a local engine needs the learner's model
    context = learner.rollout_context() if run.server is None else contextlib.nullcontext()
    with context:
        rollout = run.collector.run(run.policy, [tasks[g] for g in mine], cfg.env.group_size,
                                    version=it if version is None and run.server is None
                                    else version)
    globalize(rollout, mine, cfg.env.group_size)
    return Batch(it, rollout, time.perf_counter() - t0, version)


def learn(run: Run, it: int, batch: Batch, t0: float) -> dict[str, float]:
    """One iteration on ``batch``. The algorithm: the rows to train on, their advantages,
    the update. Then the plumbing: publish the weights, observe, persist."""
    table, dropped = run.source.train_table(batch, partial(seed_update, run))
    t1 = time.perf_counter()
    adv, diag, weight, kept = estimate(run.acc, run.cfg, table)
    metrics = train_on(run.learner, table, adv, kept)
    t_update = time.perf_counter() - t1
    metrics["perf/tokens_per_s"] = metrics["train/tokens"] / max(t_update, 1e-9)
    metrics.update(publish(run, it + 1))
    metrics.update(observe(run, it, batch, table, diag, dropped, t_update, t0))
    run.log.log(it, metrics)
    persist(run, it, batch.rollout, adv, weight)
    return metrics


def seed_update(run: Run, it: int) -> None:
    """Seed torch for iteration ``it`` (rank-distinct; the lock-step collection does the
    same before it collects)."""
    import torch

    torch.manual_seed(run.cfg.seed * 1_000_003 + it * 101 + run.acc.process_index)


def publish(run: Run, version: int) -> dict[str, float]:
    """Put the update's weights on the inference server (``model.engine: server``): the
    next rollouts use them."""
    if run.sync is None:
        return {}
    run.source.before_sync(version)
    metrics = run.sync(version)
    run.source.after_sync(version)
    return metrics


def observe(run: Run, it: int, batch: Batch, table, diag, dropped: int, t_update: float,
            t0: float) -> dict[str, float]:
    """The iteration's rollout, estimator and timing metrics, the batch source's own, and
    the held-out evaluation when one is due."""
    cfg, acc = run.cfg, run.acc
    sums = reduce_sums(acc, rollout_sums(batch.rollout))
    metrics = rollout_metrics(sums)
    metrics.update({f"adv/{k}": v for k, v in diag.items()})
    metrics.update({"perf/env_steps_per_s": sums["steps"] / max(batch.seconds, 1e-9),
                    "perf/collect_s": batch.seconds, "perf/update_s": t_update})
    metrics.update(run.source.report(acc, table, it, dropped))
    if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
        evaluation = HeldOut(run.learner, run.eval_policy, run.evaluator, cfg, run.n_eval)
        metrics.update(evaluation.metrics())
        if it + 1 == cfg.iterations:  # the final weights: the final evaluation's episodes
            run.final_eval = evaluation
    elapsed = time.perf_counter() - t0
    metrics.update({"perf/iteration_s": elapsed,
                    "perf/learner_busy": min(1.0, t_update / max(elapsed, 1e-9))})
    if run.server is not None:  # the share of the iteration with a request in flight
        busy, run.busy = run.server.busy_seconds() - run.busy, run.server.busy_seconds()
        metrics["perf/server_busy"] = min(1.0, busy / max(elapsed, 1e-9))
    return metrics


def persist(run: Run, it: int, rollout, adv, weight) -> None:
    """The iteration's episodes (with their advantages), the last one's report, and a
    checkpoint when one is due (with the batches collected ahead of it)."""
    cfg, acc = run.cfg, run.acc
    last = it + 1 == cfg.iterations
    rollout.attach(advantage=adv, weight=weight)
    records = episode_records(rollout)
    if cfg.keep_rollouts:
        tokens = cfg.keep_rollouts == "tokens"
        write_rollouts(run.run_dir, it, acc.process_index,
                       episode_records(rollout, tokens=True) if tokens else records)
    if last and acc.is_main_process:
        write_train_report(run.run_dir, cfg, it, records)
    if cfg.checkpoint_every and ((it + 1) % cfg.checkpoint_every == 0 or last):
        ahead = run.source.ahead(it)
        save_checkpoint(run.learner, run.run_dir, it, cfg.keep_checkpoints,
                        extra=(lambda path: save_ahead(path, acc.process_index, ahead))
                        if ahead else None)


def _warmup(run: Run, bar_shown: bool = False) -> None:
    """Behaviour cloning on random (the format) or expert transcripts; the warmed-up
    policy becomes the KL reference and is saved in ``warmup/``, a model folder: a
    resumed run keeps its reference from there, and later runs can start from it
    (``model.path``). Its steps show on a bar, or as a plain line every tenth of them."""
    from gaca_agent.learner.warmup import behaviour_clone

    cfg, learner, tokenizer = run.cfg, run.learner, run.tokenizer
    sync, run_dir, w = run.sync, run.run_dir, cfg.warmup
    acc = learner.accelerator
    metrics: dict[str, Any] = {}
    if w.eval_before and cfg.eval_every:
        before = HeldOut(learner, run.eval_policy, run.evaluator, cfg, run.n_eval)
        before.write(run_dir / "zero_shot_eval", "zero-shot")
        metrics.update({k.replace("eval/", "eval_before/"): v
                        for k, v in before.metrics().items()})
    if w.bc_steps > 0:
        rollout, pairs = _warmup_pairs(run)
        with warmup_progress(cfg.name, w.bc_steps,
                             bar_shown and acc.is_main_process) as on_step:
            metrics.update(behaviour_clone(learner.unwrapped, tokenizer, pairs, w.bc_steps,
                                           w.bc_batch, w.bc_lr, cfg.seed, acc.device,
                                           cfg.learner.micro_batch_size, on_step,
                                           autocast=learner.autocast))  # learner.bf16
        if w.source == "expert":  # how often the transcripts' expert won
            metrics["warmup/expert_success"] = rollout_metrics(rollout_sums(rollout))[
                "rollout/success"]
        learner.set_reference()
        learner.save_model(run_dir / "warmup")  # the reference on resume; a warm start
    if sync is not None:
        metrics.update(sync(0))  # the server rolls out with the (warmed-up) adapter
    if cfg.eval_every:  # before the first update: after the warm-up, if any
        start = HeldOut(learner, run.eval_policy, run.evaluator, cfg, run.n_eval)
        start.write(run_dir / "warmup_eval", "warmed-up" if w.bc_steps > 0 else "start")
        metrics.update(start.metrics())
    run.log.log(-1, metrics)
    if not bar_shown and acc.is_main_process:
        print(warmup_line(cfg.name, metrics), flush=True)


def _warmup_pairs(run: Run):
    """The warm-up's episodes of ``warmup.source`` and their (prompt, response) pairs, on
    the training env or on ``warmup.env_kwargs`` over its kwargs (tasks RL never draws)."""
    from gaca_agent.generate.transcripts import transcripts
    from gaca_agent.policies import make_policy

    cfg, w, collector, n_train = run.cfg, run.cfg.warmup, run.collector, run.n_train
    kwargs = w.own_env_kwargs(cfg.env.kwargs)
    own = kwargs is not None
    if own:  # its own collector, closed after
        collector, n_train = make_collector(cfg, kwargs), num_tasks_of(cfg.env.id, kwargs,
                                                                       cfg.env.servers)
    tasks = plan(w.bc_episodes, n_train or None, 50_000) if w.source == "expert" else \
        [(i % (n_train or w.bc_episodes), 50_000 + i) for i in range(w.bc_episodes)]
    try:
        rollout = collector.run(make_policy(w.source, seed=cfg.seed), tasks, 1)
        return rollout, transcripts(rollout, cfg.env.id, collector.family, collector.prompts,
                                    run.tokenizer)
    finally:
        if own:
            collector.close()


def _finish(run: Run) -> None:
    """Save the final model and evaluate it on the held-out split (ranks share the
    episodes; the main process writes ``final_eval/``)."""
    from accelerate.utils import gather_object

    cfg, learner, run_dir, n_eval = run.cfg, run.learner, run.run_dir, run.n_eval
    acc = learner.accelerator
    learner.save(run_dir / "final")
    trainable = {k for k, p in learner.unwrapped.named_parameters() if p.requires_grad}
    state = learner.state_dict()
    digests = gather_object([param_digest({k: v for k, v in state.items() if k in trainable})])
    # the last iteration's evaluation when it played these weights, else played now
    evaluation = run.final_eval or HeldOut(learner, run.eval_policy, run.evaluator, cfg, n_eval)
    evaluation.write(run_dir / "final_eval", "trained")
    if acc.is_main_process:
        write_atomic(run_dir / "final" / "rank_digests.json", json.dumps(
            {"digests": digests, "in_sync": len(set(digests)) == 1}))
        try:
            from gaca_agent.runs.plots import plot_run

            plot_run(run_dir)
        except ImportError:
            pass
    acc.wait_for_everyone()
