"""``gaca-train``: collect, estimate, update, log, evaluate, checkpoint.

    gaca-train --config configs/default.yaml [key=value ...]
    gaca-train --config configs/paper/alfworld_qwen2_5_1_5b_gigpo.yaml --dry-run
    gaca-train --resume runs/default
    accelerate launch --multi_gpu --num_processes 2 -m gaca_agent.train --config ...

Writes ``runs/<name>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one object per
iteration), TensorBoard events, ``checkpoints/`` (atomic; ``latest`` names the newest),
``reference/`` (the KL reference when the warm-up made it), ``rollouts/`` (every
iteration's episodes, unless ``keep_rollouts: false``), ``final/`` (model) and
``final_eval/`` (results.json, episodes.jsonl, report.html), and learning-curve PNGs.

With several processes each rank plays its share of the task groups and of the held-out
episodes; only the scalar step columns are gathered (for the group statistics), each rank
trains on its own rows.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gaca_agent.config import TrainConfig, describe, load_config, to_dict
from gaca_agent.evaluate import num_tasks_of
from gaca_agent.rundir import (MetricsLog, latest_checkpoint, save_checkpoint, write_atomic,
                               write_rollouts)

#: Seed of held-out episode i is EVAL_SEED + i, in every evaluation of a run.
EVAL_SEED = 10_000


class RunExists(ValueError):
    """The run directory already holds a run (resume it, or choose another name)."""


# ----------------------------------------------------------------- pieces of an iteration
def iteration_tasks(cfg: TrainConfig, iteration: int, num_tasks: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng([cfg.seed, iteration])
    ids = rng.choice(num_tasks, size=cfg.env.groups, replace=cfg.env.groups > num_tasks)
    seeds = rng.integers(0, 2**31 - 1, size=cfg.env.groups)
    return [(int(t), int(s)) for t, s in zip(ids, seeds)]


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
    from gaca_agent.rollout.table import concat_scalars, step_batch

    needs_text = cfg.algo.params.get("similarity") is not None
    parts = gather_object([table.scalars(with_observation=needs_text, anchor=cfg.algo.anchor)])
    batch = step_batch(concat_scalars(parts))
    adv, diag, rows = compute(cfg.algo.estimator, batch, details=True, **cfg.algo.params)
    start = sum(len(p["t"]) for p in parts[:acc.process_index])
    mine = slice(start, start + len(table))
    return adv[mine], diag, rows["weight"][mine]


def held_out(learner, policy, collector, cfg: TrainConfig, num_tasks: int) -> dict[str, float]:
    """Held-out success on the evaluation episodes (the final evaluation's), each rank
    playing its share."""
    from gaca_agent.evaluate import plan

    acc = learner.accelerator
    tasks = plan(cfg.env.eval_episodes, num_tasks, EVAL_SEED)
    with learner.rollout_context():
        rollout = collector.run(policy, tasks[acc.process_index::acc.num_processes], 1)
    return rollout_metrics(reduce_sums(acc, rollout_sums(rollout)), "eval")


def episode_records(rollout, extra: dict[int, dict[str, float]] | None = None
                    ) -> list[dict[str, Any]]:
    """Episode records (``episodes.jsonl`` form) of a rollout; ``extra`` adds per-row
    fields (advantage, weight) by table row."""
    from gaca_agent.results import episode_record

    records = []
    for e, ep in enumerate(rollout.episodes):
        steps = rollout.steps(ep)
        for row, step in zip(ep.rows, steps):
            step.update((extra or {}).get(row, {}))
        records.append(episode_record(e, ep, steps))
    return records


def write_train_report(run_dir: Path, cfg: TrainConfig, iteration: int, records) -> None:
    """``train_episodes.jsonl`` and ``train_report.html``: an iteration's rollouts (the
    main process's share) with each step's advantage and step-level weight as colours."""
    from gaca_agent.report import render_report
    from gaca_agent.results import summarize

    with open(run_dir / "train_episodes.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    meta = {"env": cfg.env.id, "policy": f"{cfg.name} (iteration {iteration}, "
                                         f"{cfg.algo.estimator})"}
    (run_dir / "train_report.html").write_text(render_report(
        summarize(records, meta), records, f"{cfg.name}: training rollouts, iteration {iteration}",
        training=True))


def resolve_model(cfg: TrainConfig, accelerator) -> str:
    if cfg.model.path == "tiny":
        from gaca_agent.tiny_model import cached_tiny_model

        if accelerator.is_main_process:
            cached_tiny_model(cfg.seed)
        accelerator.wait_for_everyone()
        return str(cached_tiny_model(cfg.seed))
    if cfg.model.path == "smollm2":
        from gaca_agent.policies.smollm2 import smollm2_path

        return str(smollm2_path())
    return cfg.model.path


def load_adapter(learner, checkpoint: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(checkpoint / "model" / "adapter_model.safetensors"))
    set_peft_model_state_dict(learner.unwrapped, weights)


def make_policies(cfg: TrainConfig, learner, tokenizer):
    """(training policy, held-out policy, server engine or None) for ``model.engine``."""
    m, e = cfg.model, cfg.env
    if m.engine != "server":
        from gaca_agent.policies.hf import HFPolicy

        return (*(HFPolicy(learner.unwrapped, tokenizer, t, m.max_new_tokens,
                           e.history_length, e.template_file,
                           device=learner.accelerator.device,
                           max_prompt_tokens=m.max_prompt_tokens, engine=m.engine)
                  for t in (m.temperature, m.eval_temperature)), None)
    from gaca_agent.policies.server import ServerPolicy
    from gaca_agent.rollout.server import ServerEngine

    s = cfg.server
    engine = ServerEngine(s.base_url, s.model, tokenizer, s.kind,
                          os.environ.get(s.api_key_env), s.concurrency, s.timeout_s, s.retries,
                          admin_api_key=os.environ.get(s.admin_api_key_env))
    return (*(ServerPolicy(engine, t, m.max_new_tokens, e.history_length, e.template_file)
              for t in (m.temperature, m.eval_temperature)), engine)


class WeightSync:
    """After each update the learner's weights go to the inference server, which is then
    probed (gaca_agent/rollout/probe.py) before the next rollout. LoRA: the adapter is
    saved under ``adapters/v{version}`` and loaded under a name unique to this run and
    version; full fine-tuning: the weights are saved under ``weights/v{version}`` and
    loaded through the server's disk-update API, labelled with that name. Every rank's
    engine then checks each response against it. A failed load or probe stops the run on
    every rank with the main process's reason."""

    def __init__(self, learner, engine, run_dir: Path, name: str, server,
                 temperature: float, eval_temperature: float) -> None:
        from accelerate.utils import broadcast_object_list

        self.learner, self.engine, self.server = learner, engine, server
        self.lora = learner.config.lora_r > 0
        self.dir = run_dir / ("adapters" if self.lora else "weights")
        # the probe's metric prefix and temperature: the rollouts', then the held-out one
        # when it differs (greedy sampling, temperature 0, is not probed)
        self.temperatures = [("probe", temperature)] if temperature > 0 else []
        if eval_temperature > 0 and eval_temperature != temperature:
            self.temperatures.append(("probe_eval", eval_temperature))
        self.warned_seed = False
        token = [secrets.token_hex(3)]
        if learner.accelerator.num_processes > 1:
            broadcast_object_list(token)
        self.prefix = f"{name}-{token[0]}"

    def __call__(self, version: int) -> dict[str, float]:
        acc = self.learner.accelerator
        t0 = time.perf_counter()
        name, path = f"{self.prefix}-v{version}", self.dir / f"v{version}"
        if self.lora:
            self.learner.save_adapter(path)
            load = partial(self.engine.load_adapter, name, str(path.resolve()))
        else:
            self.learner.save_weights(path, self.server.sync_dtype)
            load = partial(self.engine.update_weights_from_disk, str(path.resolve()), name)
        self._on_main(load, f"weight sync of version {version} failed")
        if self.lora:  # the other ranks' engines (the main one has it)
            self.engine.adapter = name
        if not self.lora or self.engine.kind == "sglang":  # the label responses carry
            self.engine.weight_version = name
        with self.learner.rollout_context():  # every rank (FSDP gathers); the main probes
            metrics = self._on_main(self._probe,
                                    f"after the weight sync of version {version}")
        if acc.is_main_process:  # older versions are unloaded: drop their files
            for old in self.dir.glob("v*"):
                if old.name not in (f"v{version}", f"v{version - 1}"):
                    shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return {"sync/version": float(version), "sync/seconds": time.perf_counter() - t0,
                **(metrics or {})}

    def _on_main(self, step, context: str):
        """``step()`` on the main process; its result, or its failure raised on every
        rank with the main process's reason (a probe mismatch as
        :class:`ProbeMismatch`, anything else as :class:`WeightSyncError`)."""
        from accelerate.utils import broadcast_object_list

        from gaca_agent.rollout.probe import ProbeMismatch
        from gaca_agent.rollout.server import WeightSyncError

        acc = self.learner.accelerator
        outcome: list = [None, None]
        if acc.is_main_process:
            try:
                outcome[1] = step()
            except Exception as err:  # every rank stops with the main process's reason
                outcome[0] = (isinstance(err, ProbeMismatch), f"{type(err).__name__}: {err}")
        if acc.num_processes > 1:
            broadcast_object_list(outcome)
        if outcome[0] is not None:
            mismatch, reason = outcome[0]
            raise (ProbeMismatch if mismatch else WeightSyncError)(f"{context}: {reason}")
        return outcome[1]

    def _probe(self) -> dict[str, float]:
        """The probe at the rollout and the held-out temperature (main process, inside the
        rollout context): its metrics; :class:`ProbeMismatch` beyond the tolerance."""
        from gaca_agent.rollout.probe import check, probe

        out: dict[str, float] = {}
        for tag, t in self.temperatures:
            result = probe(self.engine, self.learner.score, t, self.server.probe_tokens)
            out.update(result.metrics(tag))
            check(result, self.server.probe_tolerance, self.engine.kind)
        if not out.get("probe/seed_honoured", 1.0) and not self.warned_seed:
            self.warned_seed = True
            print("warning: the inference server ignores the request seed (SGLang: start "
                  "it with --enable-deterministic-inference): rollouts are not "
                  "reproducible from the run's seed; training is unaffected", flush=True)
        return out


def make_collector(cfg: TrainConfig, kwargs: dict, live: int | None = None):
    from gaca_agent.rollout.collector import Collector, CollectorConfig

    e = cfg.env
    return Collector(CollectorConfig(
        e.id, dict(kwargs), num_workers=e.workers, max_live_envs=live or e.max_live_envs,
        history_length=e.history_length, template_file=e.template_file, nll_span=e.nll_span,
        invalid_penalty=e.invalid_penalty, invalid_definition=e.invalid_definition,
        penalty_mode=e.penalty_mode, reward=e.reward, reward_scale=e.reward_scale,
        env_servers=list(e.servers) or None, env_token=os.environ.get("GACA_ENV_TOKEN")))


# ----------------------------------------------------------------- the loop
def train(cfg: TrainConfig, resume: Path | None = None, progress: bool = True) -> Path:
    import torch
    from accelerate import Accelerator
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from gaca_agent.learner import Learner

    acc = Accelerator(cpu=not torch.cuda.is_available())
    run_dir = resume or Path(cfg.out_dir) / cfg.name
    start, ckpt = 0, latest_checkpoint(run_dir) if resume else None
    if resume is None and (run_dir / "metrics.jsonl").exists():
        raise RunExists(f"{run_dir} already holds a run: --resume it or choose another name")
    if acc.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    acc.wait_for_everyone()
    torch.manual_seed(cfg.seed)
    base = resolve_model(cfg, acc)
    torch.manual_seed(cfg.seed)  # building the tiny model the first time draws from torch
    tokenizer = AutoTokenizer.from_pretrained(base)
    weights = str(ckpt[1] / "model") if ckpt and cfg.learner.lora_r == 0 else base
    # a resumed run keeps the reference the warm-up made (not the checkpoint's weights)
    reference = (run_dir / "reference" if (run_dir / "reference" / "config.json").exists()
                 else base) if ckpt else None
    learner = Learner(weights, tokenizer, cfg.learner, acc, reference=reference)
    if ckpt:
        if cfg.learner.lora_r > 0:
            load_adapter(learner, ckpt[1])
        learner.load_state(ckpt[1])
        start = ckpt[0] + 1
    # resuming a run killed before its first checkpoint starts over: drop its metrics
    log = MetricsLog(run_dir, acc.is_main_process, ckpt[0] if ckpt else (-2 if resume else None))
    policy, eval_policy, server = make_policies(cfg, learner, tokenizer)
    n_train = num_tasks_of(cfg.env.id, cfg.env.kwargs, cfg.env.servers)
    n_eval = num_tasks_of(cfg.env.id, cfg.env.eval_kwargs, cfg.env.servers)
    collector = make_collector(cfg, cfg.env.kwargs)
    evaluator = make_collector(cfg, cfg.env.eval_kwargs)  # one for every evaluation
    sync = (WeightSync(learner, server, run_dir, cfg.name, cfg.server,
                       cfg.model.temperature, cfg.model.eval_temperature)
            if server is not None else None)
    try:
        if start == 0:
            _warmup(cfg, learner, tokenizer, collector, evaluator, log, eval_policy, run_dir,
                    n_train, n_eval, sync)
        elif sync is not None:
            sync(start)  # a resumed run first puts its checkpoint's adapter on the server
        bar = tqdm(range(start, cfg.iterations), desc=cfg.name,
                   disable=not (progress and acc.is_main_process))
        for it in bar:
            torch.manual_seed(cfg.seed * 1_000_003 + it * 101 + acc.process_index)
            tasks = iteration_tasks(cfg, it, n_train)
            mine = list(range(acc.process_index, len(tasks), acc.num_processes))
            t0 = time.perf_counter()
            with learner.rollout_context():
                rollout = collector.run(policy, [tasks[g] for g in mine], cfg.env.group_size)
            globalize(rollout, mine, cfg.env.group_size)
            t_collect = time.perf_counter() - t0
            table = rollout.training_table()
            adv, diag, weight = estimate(acc, cfg, table)
            t1 = time.perf_counter()
            metrics = learner.update(table, adv)
            t_update = time.perf_counter() - t1
            if sync is not None:
                metrics.update(sync(it + 1))  # the next rollouts use this update's adapter
            sums = reduce_sums(acc, rollout_sums(rollout))
            metrics.update(rollout_metrics(sums))
            metrics.update({f"adv/{k}": v for k, v in diag.items()})
            metrics.update({"perf/tokens_per_s": metrics["train/tokens"] / max(t_update, 1e-9),
                            "perf/env_steps_per_s": sums["steps"] / max(t_collect, 1e-9),
                            "perf/collect_s": t_collect, "perf/update_s": t_update})
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
                metrics.update(held_out(learner, eval_policy, evaluator, cfg, n_eval))
            log.log(it, metrics)
            bar.set_postfix(success=f"{metrics['rollout/success']:.2f}",
                            eval=f"{metrics.get('eval/success', float('nan')):.2f}")
            keep = np.flatnonzero(~rollout.table["failed"])
            extra = {int(r): {"advantage": float(a), "weight": float(w)}
                     for r, a, w in zip(keep, adv, weight)}
            records = episode_records(rollout, extra)
            if cfg.keep_rollouts:
                write_rollouts(run_dir, it, acc.process_index, records)
            if it + 1 == cfg.iterations and acc.is_main_process:
                write_train_report(run_dir, cfg, it, records)
            if cfg.checkpoint_every and ((it + 1) % cfg.checkpoint_every == 0
                                         or it + 1 == cfg.iterations):
                save_checkpoint(learner, run_dir, it, cfg.keep_checkpoints)
        _finish(cfg, learner, run_dir, eval_policy, evaluator, n_eval)
    finally:
        collector.close()
        evaluator.close()
        if server is not None:
            server.close()
    acc.end_training()
    return run_dir


def _warmup(cfg, learner, tokenizer, collector, evaluator, log, eval_policy, run_dir: Path,
            n_train: int, n_eval: int, sync=None) -> None:
    """Format-only behaviour cloning; the warmed-up policy becomes the KL reference and is
    saved in ``reference/`` so that a resumed run keeps it."""
    from gaca_agent.policies import make_policy
    from gaca_agent.warmup import behaviour_clone, transcripts

    acc = learner.accelerator
    metrics: dict[str, Any] = {}
    if cfg.warmup.bc_steps > 0:
        n = cfg.warmup.bc_episodes
        tasks = [(i % n_train, 50_000 + i) for i in range(n)]
        rollout = collector.run(make_policy("random", seed=cfg.seed), tasks, 1)
        pairs = transcripts(rollout, cfg.env.id, collector.family, collector.prompts, tokenizer)
        metrics.update(behaviour_clone(learner.unwrapped, tokenizer, pairs, cfg.warmup.bc_steps,
                                       cfg.warmup.bc_batch, cfg.warmup.bc_lr, cfg.seed,
                                       acc.device))
        learner.set_reference()
        learner.save_reference(run_dir / "reference")
    if sync is not None:
        metrics.update(sync(0))  # the server rolls out with the (warmed-up) adapter
    if cfg.eval_every:
        metrics.update(held_out(learner, eval_policy, evaluator, cfg, n_eval))
    log.log(-1, metrics)


def param_digest(state: dict) -> str:
    """A hash of a model state (equal on every rank when the ranks are in sync)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _finish(cfg, learner, run_dir: Path, eval_policy, evaluator, n_eval: int) -> None:
    """Save the final model and evaluate it on the held-out split (ranks share the
    episodes; the main process writes ``final_eval/``)."""
    from accelerate.utils import gather_object

    from gaca_agent.evaluate import plan, write_results

    acc = learner.accelerator
    learner.save(run_dir / "final")
    trainable = {k for k, p in learner.unwrapped.named_parameters() if p.requires_grad}
    state = learner.state_dict()
    digests = gather_object([param_digest({k: v for k, v in state.items() if k in trainable})])
    tasks = plan(cfg.env.eval_episodes, n_eval, EVAL_SEED)
    mine = list(range(acc.process_index, len(tasks), acc.num_processes))
    with learner.rollout_context():
        rollout = evaluator.run(eval_policy, [tasks[i] for i in mine], 1)
    records = episode_records(rollout)
    for record in records:  # local episode -> the plan's episode index
        record["index"] = mine[record["index"]]
    records = gather_object(records)
    if acc.is_main_process:
        write_atomic(run_dir / "final" / "rank_digests.json", json.dumps(
            {"digests": digests, "in_sync": len(set(digests)) == 1}))
        out = run_dir / "final_eval"
        out.mkdir(parents=True, exist_ok=True)
        meta = {"env": cfg.env.id, "env_kwargs": dict(cfg.env.eval_kwargs), "policy": "trained",
                "episodes": str(cfg.env.eval_episodes), "seed": EVAL_SEED}
        with open(out / "episodes.jsonl", "w") as f:
            for record in sorted(records, key=lambda r: r["index"]):
                f.write(json.dumps(record) + "\n")
        write_results(out, {r["index"]: r for r in records}, meta, "trained", cfg.env.id, True)
        try:
            from gaca_agent.plots import plot_run

            plot_run(run_dir)
        except ImportError:
            pass
    acc.wait_for_everyone()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None, help="a run directory")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved configuration and what it means, then exit")
    parser.add_argument("overrides", nargs="*", help="key=value (e.g. algo.estimator=gigpo)")
    args = parser.parse_args(argv)
    try:
        if args.resume:
            if not (args.resume / "config.yaml").exists():
                parser.error(f"{args.resume} has no config.yaml to resume from")
            cfg = load_config(args.resume / "config.yaml", args.overrides)
        else:
            cfg = load_config(args.config, args.overrides)
    except (ValueError, TypeError, KeyError) as err:
        parser.error(str(err).strip("'\""))
    if args.dry_run:
        print(describe(cfg))
        return 0
    try:
        run_dir = train(cfg, args.resume, progress=not args.no_progress)
    except RunExists as err:
        parser.error(str(err))
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
