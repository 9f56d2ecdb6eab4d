"""The accelerate-based learner: owns model, optimizer, scheduler and reference policy.

``Learner.update(samples)`` runs PPO-clip on one batch of step samples (one sample = one
step's prompt and sampled completion, its behaviour log-probs and its advantage). It
only orchestrates: the loss maths is in :mod:`gaca_agent.losses`, and advantages arrive
already computed by the estimator registry on the whole batch, before the batch is split
across processes. Metrics are reduced as sums and counts across processes, then divided.
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from gaca_agent.losses import (Agg, KLKind, aggregate, entropy_from_logits, kl_penalty,
                               ppo_clip_loss, token_logprobs)


@dataclass(frozen=True)
class LearnerConfig:
    """Optimisation settings (defaults follow GiGPO's published ones where they exist)."""

    lr: float = 1e-6
    """Learning rate (GiGPO: 1e-6 for 1.5B/7B)."""
    weight_decay: float = 0.0
    warmup_steps: int = 0
    clip_low: float = 0.2
    """PPO clip below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.28
    """PPO clip above 1 (DAPO's clip-higher; 0.2 is symmetric PPO)."""
    loss_agg: Agg = "token-mean"
    kl_coef: float = 0.01
    """KL-to-reference loss weight (GiGPO: 0.01, low_var_kl). 0 disables the reference."""
    kl_kind: KLKind = "low_var_kl"
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    mini_batches: int = 1
    """Optimizer steps per update (the batch split into this many mini-batches)."""
    ppo_epochs: int = 1
    temperature: float = 1.0
    """The sampling temperature: log-probs are recomputed at it."""
    lora_r: int = 0
    """LoRA rank (0: full fine-tuning). With LoRA the reference is the adapter-free model."""
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    bf16: bool = False
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"loss_agg must be token-mean or seq-mean-token-mean, got {self.loss_agg!r}")
        if self.kl_kind not in ("low_var_kl", "k1", "k2"):
            raise ValueError(f"kl_kind must be low_var_kl, k1 or k2, got {self.kl_kind!r}")
        if self.micro_batch_size < 1 or self.mini_batches < 1 or self.ppo_epochs < 1:
            raise ValueError("micro_batch_size, mini_batches and ppo_epochs must be >= 1")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError("need 0 <= clip_low < 1 and clip_high >= 0")


@dataclass
class Sample:
    """One step's training sequence."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float


def pad_batch(samples: Sequence[Sample], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded inputs and, for the completion tokens, their ids, old log-probs, mask,
    and the positions of the logits that predict them."""
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    width = max(lengths)
    comp = max(len(s.completion_ids) for s in samples)
    B = len(samples)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    targets = torch.full((B, comp), pad_id, dtype=torch.long)
    old = torch.zeros((B, comp))
    mask = torch.zeros((B, comp))
    positions = torch.zeros((B, comp), dtype=torch.long)
    for b, s in enumerate(samples):
        seq = s.prompt_ids + s.completion_ids
        input_ids[b, :len(seq)] = torch.tensor(seq)
        attention[b, :len(seq)] = 1
        n, p = len(s.completion_ids), len(s.prompt_ids)
        targets[b, :n] = torch.tensor(s.completion_ids)
        old[b, :n] = torch.tensor(s.old_logprobs[:n])
        mask[b, :n] = 1
        positions[b, :n] = torch.arange(p - 1, p - 1 + n)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    out = dict(input_ids=input_ids, attention_mask=attention, targets=targets, old=old,
               mask=mask, positions=positions, adv=adv)
    return {k: v.to(device) for k, v in out.items()}


class Learner:
    """PPO-clip learner over a transformers causal LM, distributed with accelerate."""

    def __init__(self, model: Any, tokenizer: Any, config: LearnerConfig,
                 accelerator: Any = None) -> None:
        from accelerate import Accelerator

        self.config, self.tokenizer = config, tokenizer
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            dtype = torch.bfloat16 if config.bf16 and self._bf16_ok() else None
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = None
        if config.lora_r > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_targets), task_type="CAUSAL_LM"))
        elif config.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.ref_model.to(self.accelerator.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        warm = max(config.warmup_steps, 0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            model, optimizer, scheduler)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.steps = 0

    def _bf16_ok(self) -> bool:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()

    @property
    def unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------- forward passes
    def _logits(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        idx = batch["positions"].unsqueeze(-1).expand(-1, -1, out.logits.shape[-1])
        return out.logits.gather(1, idx)  # (B, T_completion, V)

    def _ref_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        t = self.config.temperature
        with torch.no_grad():
            if self.ref_model is not None:
                return token_logprobs(self._logits(self.ref_model, batch), batch["targets"], t)
            with self.unwrapped.disable_adapter():
                return token_logprobs(self._logits(self.model, batch), batch["targets"], t)

    # ------------------------------------------------------------- update
    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One PPO update on this process's share of the batch; returns reduced metrics."""
        cfg, acc = self.config, self.accelerator
        self.model.train()
        sums: dict[str, float] = {}
        order = list(range(len(samples)))
        for _ in range(cfg.ppo_epochs):
            for mini in np.array_split(order, cfg.mini_batches):
                self._step([samples[i] for i in mini], sums)
        totals = acc.reduce(torch.tensor([sums.get(k, 0.0) for k in _SUM_KEYS],
                                         device=acc.device), reduction="sum").tolist()
        s = dict(zip(_SUM_KEYS, totals))
        tokens = max(s["tokens"], 1.0)
        return {"losses/policy": s["policy"] / max(s["opt_steps"], 1.0),
                "losses/kl": s["kl"] / tokens, "losses/clip_frac": s["clip"] / tokens,
                "losses/entropy": s["entropy"] / tokens, "losses/grad_norm":
                s["grad_norm"] / max(s["opt_steps"], 1.0), "train/tokens": s["tokens"],
                "train/lr": self.scheduler.get_last_lr()[0]}

    def _step(self, mini: list[Sample], sums: dict[str, float]) -> None:
        cfg, acc = self.config, self.accelerator
        local_tokens = float(sum(len(s.completion_ids) for s in mini))
        local_seqs = float(len(mini))
        counts = acc.reduce(torch.tensor([local_tokens, local_seqs], device=acc.device), "sum")
        denom = float(counts[0] if cfg.loss_agg == "token-mean" else counts[1])
        denom = max(denom, 1.0) / acc.num_processes  # DDP averages gradients over ranks
        chunks = [mini[i:i + cfg.micro_batch_size]
                  for i in range(0, len(mini), cfg.micro_batch_size)] or [[]]
        self.optimizer.zero_grad(set_to_none=True)
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1
            ctx = acc.no_sync(self.model) if not last and acc.num_processes > 1 else _null()
            with ctx:
                self._accumulate(chunk, denom, sums)
        norm = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        sums["opt_steps"] = sums.get("opt_steps", 0.0) + 1.0 / acc.num_processes
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) / acc.num_processes

    def _accumulate(self, chunk: list[Sample], denom: float, sums: dict[str, float]) -> None:
        cfg = self.config
        if not chunk:  # this rank has no data: still join the collective backward
            loss = sum(p.sum() * 0.0 for p in self.model.parameters() if p.requires_grad)
            self.accelerator.backward(loss)
            return
        batch = pad_batch(chunk, self.pad_id, self.accelerator.device)
        logits = self._logits(self.model, batch)
        logp = token_logprobs(logits, batch["targets"], cfg.temperature)
        mask = batch["mask"]
        loss, clip_frac = ppo_clip_loss(logp, batch["old"], batch["adv"], mask, cfg.clip_low,
                                        cfg.clip_high, cfg.loss_agg, denom)
        n_tok = float(mask.sum())
        policy_part = float(loss.detach()) / self.accelerator.num_processes
        if cfg.kl_coef > 0:
            kl = kl_penalty(logp, self._ref_logprobs(batch), cfg.kl_kind)
            loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, denom)
            sums["kl"] = sums.get("kl", 0.0) + float((kl.detach() * mask).sum())
        ent = entropy_from_logits(logits.detach() if cfg.entropy_coef == 0 else logits,
                                  cfg.temperature)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * aggregate(ent, mask, cfg.loss_agg, denom)
        self.accelerator.backward(loss)
        sums["policy"] = sums.get("policy", 0.0) + policy_part
        sums["clip"] = sums.get("clip", 0.0) + float(clip_frac) * n_tok
        sums["entropy"] = sums.get("entropy", 0.0) + float((ent.detach() * mask).sum())
        sums["tokens"] = sums.get("tokens", 0.0) + n_tok

    # ------------------------------------------------------------- checkpoints
    def save(self, path: str | Path) -> None:
        """Model (or adapter), tokenizer, optimizer, scheduler and RNG states."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.accelerator.is_main_process:
            self.unwrapped.save_pretrained(path / "model")
            self.tokenizer.save_pretrained(path / "model")
            torch.save({"optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(), "steps": self.steps,
                        "rng": rng_state()}, path / "trainer_state.pt")
        self.accelerator.wait_for_everyone()

    def load_state(self, path: str | Path) -> None:
        """Restore optimizer, scheduler and RNG (the weights are loaded at construction)."""
        state = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        set_rng_state(state["rng"])


_SUM_KEYS = ("policy", "kl", "clip", "entropy", "tokens", "opt_steps", "grad_norm")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
