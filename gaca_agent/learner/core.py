"""The accelerate-based learner: owns model, optimizer, scheduler and reference policy.

``Learner.update(table, advantages)`` runs PPO-clip on this process's step rows (a
:class:`~gaca_agent.steps.StepTable`: prompt and sampled completion ids, behaviour
log-probs) with one advantage per row, computed beforehand by the estimator registry on
the whole gathered batch. It only orchestrates: the loss maths is in :mod:`.losses`,
memory-bounded log-probs in :mod:`.logprobs`, padding and micro-batches (rows of similar
length together) in :mod:`.batch`. Metrics are reduced as sums and counts across
processes, then divided (:mod:`.metrics`).

At scale (1.5B-7B) it is correct by construction:

- **Mixed precision**: parameters and AdamW state stay fp32 (masters); with ``bf16`` the
  forward passes run under bf16 autocast (under ``fsdp``, FSDP2's param dtype), so a
  1e-6 step is not rounded away as it is on bf16 weights.
- **Memory-bounded log-probs**: the output layer computes the chosen tokens' log-probs
  chunk by chunk (never batch x tokens x vocabulary, :mod:`gaca_agent.learner.logprobs`); the
  entropy is computed only when its loss term or ``log_entropy`` needs it.
- **Rank-symmetric**: every rank runs the same number of mini-batches, micro-batches,
  forward and backward calls (a rank with fewer rows pads with zero-weight micro-batches),
  so DDP and FSDP collectives never wait on a rank that has stopped.
- **Sparse rows skipped exactly**: with the PPO term alone, a row of advantage 0 (no
  gradient) is neither forwarded nor recomputed (:func:`.batch.rows_with_gradient`).
- **Identical rows forwarded once**: rows of the same prompt and completion ids (a group's
  episodes that act alike) share one forward pass in every pass; the loss still sees
  each row with its own advantage, old log-probs and weights (:func:`.batch.identical_rows`).
- **Reference**: a frozen copy of the policy (the warmed-up one, :meth:`set_reference`),
  sharded like the policy under ``fsdp``; under LoRA the adapter-free base.
- **Old log-probs**: ``rollout`` (the engine's sampled log-probs) or ``recompute`` (a
  teacher-forced pass by the learner before the update, as verl does), optionally with
  the decoupled objective's importance weights on pi_learner_old / pi_rollout,
  truncated (``tis_cap``) or masked (``is_mask``, ``is_geo_mask``;
  :mod:`gaca_agent.learner.correction`; the ratio's mean and max are logged every update).
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gaca_agent.learner.accelerator import check_precision, make_accelerator
from gaca_agent.learner.logprobs import forward_token_logprobs
from gaca_agent.learner.batch import (PAD, identical_rows, micro_batches, pad_batch,
                                      rows_with_gradient, sampled_rows, split_even,
                                      with_advantages, with_kin)
from gaca_agent.learner.checkpoint import load_fp32, rng_state, set_rng_state
from gaca_agent.learner.config import LearnerConfig
from gaca_agent.learner.fsdp import clip_grad_norm, full_state, shard
from gaca_agent.learner.losses import aggregate, kl_penalty, ppo_clip_loss
from gaca_agent.learner.metrics import SUM_KEYS, update_metrics
from gaca_agent.learner.precision import resolve_bf16
from gaca_agent.learner.rollouts import RolloutCopy, rollout_context, wanted

class Learner:
    """PPO-clip learner over a transformers causal LM, distributed with accelerate."""

    def __init__(self, model: Any, tokenizer: Any, config: LearnerConfig,
                 accelerator: Any = None, reference: Any = None) -> None:
        self.tokenizer = tokenizer
        self.accelerator = accelerator or make_accelerator()
        check_precision(self.accelerator)
        # bf16 as a bool from here on: auto is bf16 only on a device that computes it natively
        config = replace(config, bf16=resolve_bf16(config.bf16, self.accelerator.device))
        self.config = config
        if config.fsdp and self.accelerator.num_processes > 1 and \
                self.accelerator.state.distributed_type.name.startswith("FSDP"):
            raise ValueError("learner.fsdp shards the model itself: launch with a plain "
                             "multi-process accelerate config, not accelerate's FSDP plugin")
        model = load_fp32(model)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        self.ref_model = None
        if config.lora_r > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_targets), task_type="CAUSAL_LM"))
        elif config.kl_coef > 0:
            ref = load_fp32(reference) if reference is not None else copy.deepcopy(model)
            self.ref_model = ref.eval().requires_grad_(False)
        device = self.accelerator.device
        self.sharded = config.fsdp and self.accelerator.num_processes > 1
        if self.sharded:
            model.to(device)
            shard(model, config.bf16)
            if self.ref_model is not None:
                self.ref_model.to(device)
                shard(self.ref_model, config.bf16)
        elif self.ref_model is not None:
            self.ref_model.to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        warm = max(config.warmup_steps, 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0)
        if self.sharded:
            self.model = model
            self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        else:
            self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
                model, optimizer, scheduler)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.steps = 0
        self.rollout_copy = RolloutCopy(self.unwrapped) if wanted(
            config.bf16, self.sharded, self.accelerator.device) else None

    @property
    def rollout_model(self):
        """What rollouts generate with, inside :meth:`rollout_context`: the policy, or
        its bf16 copy on a CPU (:mod:`gaca_agent.learner.rollouts`)."""
        return self.unwrapped if self.rollout_copy is None else self.rollout_copy.model

    @property
    def unwrapped(self):
        return self.model if self.sharded else self.accelerator.unwrap_model(self.model)

    def autocast(self):
        """bf16 autocast around forward passes (not under FSDP2, which casts itself)."""
        if not self.config.bf16 or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16)

    def rollout_context(self):
        """Around generation with :attr:`rollout_model` (:func:`gaca_agent.learner.rollouts.
        rollout_context`: FSDP2's gathered parameters, autocast or the bf16 copy)."""
        return rollout_context(self)

    def set_reference(self) -> None:
        """Make the current policy the KL reference (after the warm-up)."""
        if self.ref_model is None:
            return
        self.ref_model.load_state_dict(self.unwrapped.state_dict())

    # ------------------------------------------------------------- forward passes
    def _logprobs(self, model, batch: dict[str, torch.Tensor], with_entropy: bool = False):
        with self.autocast():
            return forward_token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                          batch["positions"], batch["targets"],
                                          self.config.scoring_temperature, with_entropy)

    def score(self, prompt_ids, completion_ids, temperature: float | None = None) -> np.ndarray:
        """The current policy's log-probs of one completion at ``temperature`` (None: where
        the update recomputes; the server probe). Under FSDP2: in :meth:`rollout_context`."""
        temperature = self.config.scoring_temperature if temperature is None else temperature
        from gaca_agent.steps import StepTable

        one = with_advantages(StepTable.from_tokens([prompt_ids], [completion_ids],
                                                    [np.zeros(len(completion_ids))]), [0.0])
        batch = pad_batch(one, np.asarray([0]), self.pad_id, self.accelerator.device)
        model = self.unwrapped  # no DDP wrapper: its forward would wait for the other ranks
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self.autocast():
                logp, _ = forward_token_logprobs(
                    model, batch["input_ids"], batch["attention_mask"], batch["positions"],
                    batch["targets"], temperature if temperature > 0 else 1.0)
        finally:
            model.train(was_training)
        return logp[0].float().cpu().numpy()

    def _ref_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return self._logprobs(self.ref_model, batch)[0]
            with self.unwrapped.disable_adapter():
                return self._logprobs(self.model, batch)[0]

    # ------------------------------------------------------------- symmetric schedule
    def _global_max(self, value: int | float) -> int | float:
        """The maximum of ``value`` over the ranks (an int stays an int)."""
        if self.accelerator.num_processes == 1:
            return value
        import torch.distributed as dist

        kind = int if isinstance(value, int) else float
        t = torch.tensor([value], device=self.accelerator.device,
                         dtype=torch.int64 if kind is int else torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return kind(t.item())

    def _global_sum(self, values: list[float]) -> list[float]:
        acc = self.accelerator
        t = torch.tensor(values, device=acc.device, dtype=torch.float64)
        return acc.reduce(t, reduction="sum").tolist() if acc.num_processes > 1 else t.tolist()

    def _micro(self, data, rows: np.ndarray) -> list[np.ndarray]:
        """Micro-batches of ``rows`` by length, padded to the largest count of any rank."""
        size, tokens = self.config.micro_batch_size, data["prompt_ids"].lengths()
        return micro_batches(rows, size, self._global_max(-(-len(rows) // size)),
                             tokens + data["completion_ids"].lengths())

    def _n_mini(self, n_rows: int) -> int:
        if self.config.mini_batch_rows is None:
            return self.config.mini_batches
        total = self._global_sum([float(n_rows)])[0]
        return max(1, math.ceil(total / self.config.mini_batch_rows))

    # ------------------------------------------------------------- update
    def update(self, table, advantages: np.ndarray) -> dict[str, float]:
        """One PPO update on this process's step rows (a :class:`StepTable`, one advantage
        per row); returns reduced metrics."""
        cfg = self.config
        data = with_advantages(table, advantages)
        rows = sampled_rows(data)
        gap = 0.0
        ratio = {"ratio_sum": 0.0, "ratio_max": 0.0, "ratio_n": 0.0, "truncated": 0.0,
                 "masked": 0.0}
        if cfg.old_logprobs == "recompute":  # for the rows the loss has a gradient from
            data, gap, ratio = self._recompute_old(
                data, rows_with_gradient(data, rows, cfg.policy_loss_only))
        self.model.train()
        sums: dict[str, float] = {}
        n_mini = self._n_mini(len(rows))
        for _ in range(cfg.ppo_epochs):
            for mini in split_even(rows, n_mini):
                self._step(data, mini, sums)
        extra = ("ratio_sum", "ratio_n", "truncated", "masked")
        totals = self._global_sum([sums.get(k, 0.0) for k in SUM_KEYS]
                                  + [gap] + [ratio[k] for k in extra])
        s = dict(zip(SUM_KEYS + ("gap",) + extra, totals))
        # the importance ratio's maximum over ranks: an all-reduce only where it is logged
        ratio_max = (self._global_max(float(ratio["ratio_max"]))
                     if cfg.old_logprobs == "recompute" else 0.0)
        return update_metrics(s, cfg, self.scheduler.get_last_lr()[0], ratio_max)

    def _recompute_old(self, data, rows: np.ndarray):
        """Old (proximal) log-probs from a teacher-forced pass under the current parameters
        (the table's ``logprobs`` column replaced), the summed absolute difference to the
        sampled (behaviour) ones, and the importance weights of the configured correction
        (:mod:`gaca_agent.learner.correction`; an ``is_weight`` column when it weighs)
        with their statistics."""
        from gaca_agent.learner.correction import importance_weights
        from gaca_agent.steps import Ragged

        comps, sampled_lp = data["completion_ids"], data["logprobs"]
        offsets = comps.offsets
        old = np.asarray(sampled_lp.values, dtype=np.float64).copy()
        kin = identical_rows(data, rows)  # rows of the same ids: one pass
        self.model.eval()
        with torch.no_grad():
            for chunk in self._micro(data, np.fromiter(kin, dtype=np.int64)):
                batch = pad_batch(data, chunk, self.pad_id, self.accelerator.device)
                logp = self._logprobs(self.model, batch)[0].float().cpu().numpy()
                for b, i in enumerate(chunk):
                    for j in (kin[i] if i != PAD else ()):
                        n, at = len(comps[j]), offsets[j]
                        old[at:at + n] = logp[b, :n]
        picked = np.zeros(len(old), dtype=bool)  # the tokens of the trained rows
        for i in rows:
            picked[offsets[i]:offsets[i + 1]] = True
        behaviour = np.where(picked, np.asarray(sampled_lp.values, dtype=np.float64), np.nan)
        known = np.isfinite(behaviour)
        gap = float(np.abs(old - behaviour)[known].sum())
        weight, stats = importance_weights(old, behaviour, offsets, self.config.correction)
        columns = {"logprobs": Ragged(old, offsets)}
        if weight is not None:
            columns["is_weight"] = Ragged(weight, offsets)
        return data.with_columns(**columns), gap, stats

    def _step(self, data, mini: np.ndarray, sums: dict[str, float]) -> None:
        cfg, acc = self.config, self.accelerator
        local_tokens = float(data["completion_ids"].lengths()[mini].sum())
        counts = self._global_sum([local_tokens, float(len(mini))])
        denom = float(counts[0] if cfg.loss_agg == "token-mean" else counts[1])
        denom = max(denom, 1.0) / acc.num_processes  # gradients are averaged over ranks
        live = rows_with_gradient(data, mini, cfg.policy_loss_only)
        kin = identical_rows(data, live)  # rows of the same ids share one forward pass
        # every rank runs the same number of passes; one padding pass when no row is live
        # anywhere, so the optimizer steps on zero gradients exactly as it would unskipped
        chunks = self._micro(data, np.fromiter(kin, dtype=np.int64)) or [np.asarray([PAD])]
        sums["tokens"] = sums.get("tokens", 0.0) + local_tokens
        sums["skipped"] = sums.get("skipped", 0.0) + float(len(mini) - len(live))
        sums["shared"] = sums.get("shared", 0.0) + float(len(live) - len(kin))
        sums["rows"] = sums.get("rows", 0.0) + float(len(mini))
        self.optimizer.zero_grad(set_to_none=True)
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1
            sync = self.sharded or last or acc.num_processes == 1
            with (contextlib.nullcontext() if sync else acc.no_sync(self.model)):
                self._accumulate(data, chunk, kin, denom, sums)
        norm = clip_grad_norm(self.model, cfg.max_grad_norm, self.sharded, acc)
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        sums["opt_steps"] = sums.get("opt_steps", 0.0) + 1.0 / acc.num_processes
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) / acc.num_processes

    def _accumulate(self, data, chunk: np.ndarray, kin: dict[int, np.ndarray], denom: float,
                    sums: dict[str, float]) -> None:
        cfg = self.config
        device = self.accelerator.device
        batch = pad_batch(data, chunk, self.pad_id, device)
        want_entropy = cfg.entropy_coef > 0 or cfg.log_entropy
        logp, ent = self._logprobs(self.model, batch, want_entropy)
        ref = self._ref_logprobs(batch) if cfg.kl_coef > 0 else None
        rows, index = with_kin(chunk, kin)
        if len(rows) > len(chunk):  # each row of the same ids: the loss with its own columns
            at = torch.as_tensor(index, device=device)
            batch = pad_batch(data, rows, self.pad_id, device)
            logp, ent, ref = (None if t is None else t.index_select(0, at)
                              for t in (logp, ent, ref))
        mask = batch["mask"]
        loss, clip_frac = ppo_clip_loss(
            logp, batch["old"], batch["adv"], mask, cfg.clip_low, cfg.clip_high, cfg.loss_agg,
            denom, cfg.clip_ratio_c, batch["isw"] if cfg.correction.weighted else None)
        n_tok = float(mask.sum())
        policy_part = float(loss.detach()) / self.accelerator.num_processes
        if cfg.kl_coef > 0:
            kl = kl_penalty(logp, ref, cfg.kl_kind)
            loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, denom)
            sums["kl"] = sums.get("kl", 0.0) + float((kl.detach() * mask).sum())
        if ent is not None:
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * aggregate(ent, mask, cfg.loss_agg, denom)
            sums["entropy"] = sums.get("entropy", 0.0) + float((ent.detach() * mask).sum())
        self.accelerator.backward(loss)
        sums["policy"] = sums.get("policy", 0.0) + policy_part
        sums["clip"] = sums.get("clip", 0.0) + float(clip_frac) * n_tok

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) model state on every rank's CPU."""
        if not self.sharded:
            return {k: v.detach().cpu() for k, v in self.unwrapped.state_dict().items()}
        return full_state(self.model)

    def save_adapter(self, path: str | Path) -> None:
        """The LoRA adapter alone (peft's files), as an inference server loads it."""
        if self.config.lora_r <= 0:
            raise ValueError("save_adapter needs a LoRA learner (lora_r > 0)")
        weights = self.state_dict() if self.sharded else None
        if self.accelerator.is_main_process:
            self.unwrapped.save_pretrained(Path(path), state_dict=weights)
        self.accelerator.wait_for_everyone()

    def save_weights(self, path: str | Path, dtype: str = "float32") -> None:
        """The full model as an inference server loads it from disk (config and
        safetensors, in ``dtype``), for the full-weight sync."""
        if self.config.lora_r > 0:
            raise ValueError("save_weights is for full fine-tuning; save_adapter for LoRA")
        state = self.state_dict()
        if self.accelerator.is_main_process:
            cast = getattr(torch, dtype)
            state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
            self.unwrapped.save_pretrained(Path(path), state_dict=state)
        self.accelerator.wait_for_everyone()

    def full_weights(self, dtype: str = "float32") -> list[tuple[str, torch.Tensor]]:
        """The full model's named tensors (CPU; floating ones in ``dtype``), as the
        inference server loads them: the broadcast weight sync's payload."""
        cast = getattr(torch, dtype)
        return [(k, v.to(cast) if v.is_floating_point() else v)
                for k, v in self.state_dict().items()]

    def save(self, path: str | Path) -> None:
        """Model (or adapter), tokenizer, optimizer, scheduler and RNG states. Under
        ``fsdp`` each rank writes its optimizer shard."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        acc = self.accelerator
        self.save_model(path / "model")
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "steps": self.steps, "rng": rng_state()}
        if self.sharded:
            torch.save(state, path / f"trainer_state.rank{acc.process_index}.pt")
        elif acc.is_main_process:
            torch.save(state, path / "trainer_state.pt")
        acc.wait_for_everyone()

    def save_model(self, path: str | Path) -> None:
        """The policy as a transformers folder (with its tokenizer): ``model.path``,
        ``gaca-eval --policy hf:PATH`` and ``gaca-serve`` read it; under LoRA, the adapter."""
        weights = self.state_dict() if self.sharded else None
        if self.accelerator.is_main_process:
            self.unwrapped.save_pretrained(Path(path), state_dict=weights)
            self.tokenizer.save_pretrained(Path(path))
        self.accelerator.wait_for_everyone()

    def load_state(self, path: str | Path) -> None:
        """Restore optimizer, scheduler and RNG (the weights are loaded at construction)."""
        name = (f"trainer_state.rank{self.accelerator.process_index}.pt" if self.sharded
                else "trainer_state.pt")
        state = torch.load(Path(path) / name, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        set_rng_state(state["rng"])

