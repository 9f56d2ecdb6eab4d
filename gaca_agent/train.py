"""``gaca-train``: collect, estimate, update, log, evaluate, checkpoint.

    gaca-train --config configs/default.yaml [key=value ...]
    gaca-train --resume runs/default
    accelerate launch --multi_gpu --num_processes 2 -m gaca_agent.train --config ...

Writes ``runs/<name>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one object per
iteration), TensorBoard events, ``checkpoints/`` (atomic; ``latest`` names the newest),
``final/`` (model) and ``final_eval/`` (results.json, episodes.jsonl, report.html), and
learning-curve PNGs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gaca_agent.config import TrainConfig, load_config, to_dict
from gaca_agent.evaluate import num_tasks_of

#: Seed of held-out episode i is EVAL_SEED + i, in every evaluation of a run.
EVAL_SEED = 10_000


# ----------------------------------------------------------------- run directory
def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    path = run_dir / "checkpoints" / name
    return (int(name.split("-")[1]), path) if path.is_dir() else None


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(learner, run_dir: Path, iteration: int, keep: int) -> None:
    """Write to a temporary folder, rename it, then move the ``latest`` pointer: a kill
    at any moment leaves the previous checkpoint intact and named."""
    root = run_dir / "checkpoints"
    final = root / f"iter-{iteration:05d}"
    tmp = root / f".tmp-iter-{iteration:05d}"
    if learner.accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    learner.accelerator.wait_for_everyone()
    learner.save(tmp)
    if learner.accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_atomic(root / "latest", final.name)
        for old in sorted(root.glob("iter-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    learner.accelerator.wait_for_everyone()


class MetricsLog:
    """``metrics.jsonl`` and TensorBoard, written by the main process."""

    def __init__(self, run_dir: Path, main: bool, resume_after: int | None) -> None:
        self.main, self.path = main, run_dir / "metrics.jsonl"
        self.writer = None
        if not main:
            return
        if resume_after is not None and self.path.exists():  # drop what the killed run
            kept = [line for line in self.path.read_text().splitlines()  # wrote later
                    if _json_ok(line) and json.loads(line)["iteration"] <= resume_after]
            write_atomic(self.path, "".join(line + "\n" for line in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard not installed: jsonl only
            self.writer = None

    def log(self, iteration: int, metrics: dict[str, Any]) -> None:
        if not self.main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        if self.writer is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.writer.add_scalar(k, v, iteration)
            self.writer.flush()


def _json_ok(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


# ----------------------------------------------------------------- pieces of an iteration
def iteration_tasks(cfg: TrainConfig, iteration: int, num_tasks: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng([cfg.seed, iteration])
    ids = rng.choice(num_tasks, size=cfg.env.groups, replace=cfg.env.groups > num_tasks)
    seeds = rng.integers(0, 2**31 - 1, size=cfg.env.groups)
    return [(int(t), int(s)) for t, s in zip(ids, seeds)]


def rollout_metrics(episodes) -> dict[str, float]:
    done = [e for e in episodes if not e.failed]
    steps = [s for e in done for s in e.steps]
    n = max(len(done), 1)
    return {"rollout/success": sum(e.won for e in done) / n,
            "rollout/score": sum(e.score for e in done) / n,
            "rollout/return": sum(e.total_reward for e in done) / n,
            "rollout/length": sum(e.length for e in done) / n,
            "rollout/format_invalid": (sum(not s.format_valid for s in steps) / len(steps)
                                       if steps else 0.0),
            "rollout/failed": sum(e.failed for e in episodes)}


def build_samples(episodes, index, adv, mine: set[int]):
    from gaca_agent.learner import Sample

    samples = []
    for (e, t), a in zip(index, adv):
        ep = episodes[e]
        step = ep.steps[t]
        if ep.traj in mine and step.completion_ids:
            samples.append(Sample(step.prompt_ids, step.completion_ids, step.logprobs, float(a)))
    return samples


def write_train_report(run_dir: Path, cfg: TrainConfig, iteration: int, episodes, index,
                       adv, weight) -> None:
    """``train_episodes.jsonl`` and ``train_report.html``: an iteration's rollouts with each
    step's advantage and step-level weight (GACA's w_t), shown as colours."""
    from gaca_agent.report import render_report
    from gaca_agent.results import episode_record, summarize

    per_step = {(e, t): (float(a), float(w)) for (e, t), a, w in zip(index, adv, weight)}
    records = []
    for e, ep in enumerate(episodes):
        record = episode_record(e, ep)
        for step in record["trajectory"]:
            if (e, step["t"]) in per_step:
                step["advantage"], step["weight"] = per_step[(e, step["t"])]
        records.append(record)
    with open(run_dir / "train_episodes.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    meta = {"env": cfg.env.id, "policy": f"{cfg.name} (iteration {iteration}, "
                                         f"{cfg.algo.estimator})"}
    (run_dir / "train_report.html").write_text(render_report(
        summarize(records, meta), records, f"{cfg.name}: training rollouts, iteration {iteration}"))


def held_out_success(policy, cfg: TrainConfig, num_tasks: int) -> dict[str, float]:
    from gaca_agent.collector import Collector, CollectorConfig
    from gaca_agent.evaluate import plan

    # the same episodes as the final evaluation (``evaluate`` with seed EVAL_SEED)
    tasks = plan(cfg.env.eval_episodes, num_tasks, EVAL_SEED)
    collector = Collector(CollectorConfig(cfg.env.id, dict(cfg.env.eval_kwargs),
                                          max_live_envs=min(cfg.env.max_live_envs, len(tasks)),
                                          history_length=cfg.env.history_length,
                                          template_file=cfg.env.template_file,
                                          num_workers=cfg.env.workers))
    try:
        episodes = collector.run(policy, tasks, 1)
    finally:
        collector.close()
    m = rollout_metrics(episodes)
    return {"eval/success": m["rollout/success"], "eval/score": m["rollout/score"],
            "eval/length": m["rollout/length"], "eval/format_invalid": m["rollout/format_invalid"]}


def resolve_model(cfg: TrainConfig, run_dir: Path, accelerator) -> str:
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


# ----------------------------------------------------------------- the loop
def train(cfg: TrainConfig, resume: Path | None = None, progress: bool = True) -> Path:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import gather_object
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from gaca_agent.advantages import compute
    from gaca_agent.collector import Collector, CollectorConfig, to_step_batch
    from gaca_agent.learner import Learner
    from gaca_agent.policies.hf import HFPolicy

    acc = Accelerator(cpu=not torch.cuda.is_available())
    run_dir = resume or Path(cfg.out_dir) / cfg.name
    start, ckpt = 0, latest_checkpoint(run_dir) if resume else None
    if resume is None and (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{run_dir} already holds a run: --resume it or choose another name")
    if acc.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    acc.wait_for_everyone()
    torch.manual_seed(cfg.seed)
    base = resolve_model(cfg, run_dir, acc)
    torch.manual_seed(cfg.seed)  # building the tiny model the first time draws from torch
    tokenizer = AutoTokenizer.from_pretrained(base)
    weights = str(ckpt[1] / "model") if ckpt and cfg.learner.lora_r == 0 else base
    learner = Learner(weights, tokenizer, cfg.learner, acc)
    if ckpt:
        if cfg.learner.lora_r > 0:
            load_adapter(learner, ckpt[1])
        learner.load_state(ckpt[1])
        start = ckpt[0] + 1
    # resuming a run killed before its first checkpoint starts over: drop its metrics
    log = MetricsLog(run_dir, acc.is_main_process, ckpt[0] if ckpt else (-2 if resume else None))
    m = cfg.model
    policy = HFPolicy(learner.unwrapped, tokenizer, m.temperature, m.max_new_tokens,
                      cfg.env.history_length, cfg.env.template_file, device=acc.device,
                      max_prompt_tokens=m.max_prompt_tokens)
    eval_policy = HFPolicy(learner.unwrapped, tokenizer, m.eval_temperature, m.max_new_tokens,
                           cfg.env.history_length, cfg.env.template_file, device=acc.device,
                           max_prompt_tokens=m.max_prompt_tokens)
    n_train = num_tasks_of(cfg.env.id, cfg.env.kwargs)
    n_eval = num_tasks_of(cfg.env.id, cfg.env.eval_kwargs)
    collector = Collector(CollectorConfig(
        cfg.env.id, dict(cfg.env.kwargs), num_workers=cfg.env.workers,
        max_live_envs=cfg.env.max_live_envs, history_length=cfg.env.history_length,
        template_file=cfg.env.template_file, nll_span=cfg.env.nll_span,  # type: ignore[arg-type]
        invalid_penalty=cfg.env.invalid_penalty))
    try:
        if start == 0:
            _warmup(cfg, learner, tokenizer, collector, acc, log, eval_policy, n_train, n_eval)
        bar = tqdm(range(start, cfg.iterations), desc=cfg.name, disable=not (progress and acc.is_main_process))
        for it in bar:
            torch.manual_seed(cfg.seed * 1_000_003 + it * 101 + acc.process_index)
            tasks = iteration_tasks(cfg, it, n_train)
            mine = list(range(acc.process_index, len(tasks), acc.num_processes))
            t0 = time.perf_counter()
            local = collector.run(policy, [tasks[g] for g in mine], cfg.env.group_size)
            for ep in local:  # local group/trajectory ids -> global ones
                g = mine[ep.group]
                ep.traj = g * cfg.env.group_size + ep.traj % cfg.env.group_size
                ep.group = g
            t_collect = time.perf_counter() - t0
            episodes = sorted(gather_object(local), key=lambda e: e.traj)
            batch, index = to_step_batch(episodes)
            adv, diag, rows = compute(cfg.algo.estimator, batch, details=True, **cfg.algo.params)
            samples = build_samples(episodes, index, adv, {e.traj for e in local})
            t1 = time.perf_counter()
            metrics = learner.update(samples)
            t_update = time.perf_counter() - t1
            metrics.update(rollout_metrics(episodes))
            metrics.update({f"adv/{k}": v for k, v in diag.items()})
            env_steps = sum(e.length for e in episodes)
            metrics.update({"perf/tokens_per_s": metrics["train/tokens"] / max(t_update, 1e-9),
                            "perf/env_steps_per_s": env_steps / max(t_collect, 1e-9),
                            "perf/collect_s": t_collect, "perf/update_s": t_update})
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
                if acc.is_main_process:
                    metrics.update(held_out_success(eval_policy, cfg, n_eval))
                acc.wait_for_everyone()
            log.log(it, metrics)
            bar.set_postfix(success=f"{metrics['rollout/success']:.2f}",
                            eval=f"{metrics.get('eval/success', float('nan')):.2f}")
            if it + 1 == cfg.iterations and acc.is_main_process:
                write_train_report(run_dir, cfg, it, episodes, index, adv, rows["weight"])
            if cfg.checkpoint_every and ((it + 1) % cfg.checkpoint_every == 0
                                         or it + 1 == cfg.iterations):
                save_checkpoint(learner, run_dir, it, cfg.keep_checkpoints)
    finally:
        collector.close()
    _finish(cfg, learner, run_dir, eval_policy, acc)
    acc.end_training()
    return run_dir


def _warmup(cfg, learner, tokenizer, collector, acc, log, eval_policy, n_train: int,
            n_eval: int) -> None:
    from gaca_agent.policies import make_policy
    from gaca_agent.warmup import behaviour_clone, transcripts

    metrics: dict[str, Any] = {}
    if cfg.warmup.bc_steps > 0:
        n = cfg.warmup.bc_episodes
        tasks = [(i % n_train, 50_000 + i) for i in range(n)]
        episodes = collector.run(make_policy("random", seed=cfg.seed), tasks, 1)
        pairs = transcripts(episodes, cfg.env.id, collector.family, collector.prompts, tokenizer)
        metrics.update(behaviour_clone(learner.unwrapped, tokenizer, pairs, cfg.warmup.bc_steps,
                                       cfg.warmup.bc_batch, cfg.warmup.bc_lr, cfg.seed,
                                       acc.device))
        if learner.ref_model is not None:  # the warmed-up policy is the KL reference
            learner.ref_model.load_state_dict(learner.unwrapped.state_dict())
    if cfg.eval_every and acc.is_main_process:
        metrics.update(held_out_success(eval_policy, cfg, n_eval))
    acc.wait_for_everyone()
    log.log(-1, metrics)


def param_digest(model) -> str:
    """A hash of the trainable parameters (equal on every rank when DDP is in sync)."""
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _finish(cfg, learner, run_dir: Path, eval_policy, acc) -> None:
    from accelerate.utils import gather_object

    from gaca_agent.evaluate import evaluate

    learner.save(run_dir / "final")
    digests = gather_object([param_digest(learner.unwrapped)])
    if acc.is_main_process:
        write_atomic(run_dir / "final" / "rank_digests.json", json.dumps(
            {"digests": digests, "in_sync": len(set(digests)) == 1}))
        evaluate(cfg.env.id, dict(cfg.env.eval_kwargs), "trained", cfg.env.eval_episodes,
                 run_dir / "final_eval", seed=EVAL_SEED, policy=eval_policy, progress=False,
                 history_length=cfg.env.history_length)
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
        parser.error(str(err))
    run_dir = train(cfg, args.resume, progress=not args.no_progress)
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
