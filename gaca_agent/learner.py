"""The accelerate-based learner: owns model, optimizer, scheduler and reference policy.

``Learner.update(table, advantages)`` runs PPO-clip on this process's step rows (a
:class:`~gaca_agent.rollout.table.StepTable`: prompt and sampled completion ids, behaviour
log-probs) with one advantage per row, computed beforehand by the estimator registry on
the whole gathered batch. It only orchestrates: the loss maths is in
:mod:`gaca_agent.losses`, memory-bounded log-probs in :mod:`gaca_agent.logprobs`. Metrics
are reduced as sums and counts across processes, then divided.

At scale (1.5B-7B) it is correct by construction:

- **Mixed precision**: parameters and AdamW state stay fp32 (masters); with ``bf16`` the
  forward passes run under bf16 autocast (under ``fsdp``, FSDP2's param dtype), so a
  1e-6 step is not rounded away as it is on bf16 weights.
- **Memory-bounded log-probs**: the output layer computes the chosen tokens' log-probs
  chunk by chunk (never batch x tokens x vocabulary, :mod:`gaca_agent.logprobs`); the
  entropy is computed only when its loss term or ``log_entropy`` needs it.
- **Rank-symmetric**: every rank runs the same number of mini-batches, micro-batches,
  forward and backward calls (a rank with fewer rows pads with zero-weight micro-batches),
  so DDP and FSDP collectives never wait on a rank that has stopped.
- **Reference**: a frozen copy of the policy (the warmed-up one, :meth:`set_reference`),
  sharded like the policy under ``fsdp``; under LoRA the adapter-free base.
- **Old log-probs**: ``rollout`` (the engine's sampled log-probs) or ``recompute`` (a
  teacher-forced pass by the learner before the update, as verl does), optionally with
  truncated importance sampling on pi_learner_old / pi_rollout (``tis_cap``; the ratio's
  mean and max are logged every update).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from gaca_agent.logprobs import forward_token_logprobs
from gaca_agent.losses import Agg, KLKind, aggregate, kl_penalty, ppo_clip_loss

OldLogprobs = Literal["rollout", "recompute"]


@dataclass(frozen=True)
class LearnerConfig:
    """Optimisation settings (defaults follow GiGPO's published ones where they exist)."""

    lr: float = 1e-6
    """Learning rate (GiGPO: 1e-6 for 1.5B/7B)."""
    weight_decay: float = 0.0
    """AdamW weight decay (verl-agent's GiGPO scripts: 0.01)."""
    warmup_steps: int = 0
    clip_low: float = 0.2
    """PPO clip below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = 0.28
    """PPO clip above 1 (DAPO's clip-higher; 0.2 is symmetric PPO, verl-agent's)."""
    clip_ratio_c: float | None = None
    """Dual-clip bound for negative advantages (Ye et al., 2020): the loss of a token with
    A < 0 is at most -c * A. verl's default c = 3; None disables it."""
    loss_agg: Agg = "token-mean"
    kl_coef: float = 0.01
    """KL-to-reference loss weight (GiGPO: 0.01, low_var_kl). 0 disables the reference."""
    kl_kind: KLKind = "low_var_kl"
    entropy_coef: float = 0.0
    """Entropy bonus weight (verl-agent's GiGPO scripts: 0.001)."""
    log_entropy: bool = False
    """Log ``losses/entropy`` even when ``entropy_coef`` is 0 (costs a softmax per token)."""
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    mini_batches: int = 1
    """Optimizer steps per epoch (the batch split into this many mini-batches), unless
    ``mini_batch_rows`` is set."""
    mini_batch_rows: int | None = None
    """Step rows per optimizer step over the whole (all-rank) batch: steps per epoch =
    ceil(rows / mini_batch_rows) (verl-agent: 256 ALFWorld, 64 WebShop)."""
    ppo_epochs: int = 1
    temperature: float = 1.0
    """The sampling temperature: log-probs are recomputed at it."""
    old_logprobs: OldLogprobs = "rollout"
    """``rollout``: the engine's sampled log-probs; ``recompute``: a teacher-forced pass by
    the learner before the update (as verl; use it when rollout kernels differ)."""
    tis_cap: float | None = None
    """Truncated importance sampling (with ``old_logprobs: recompute``): each token's policy
    loss is weighted by min(pi_learner_old / pi_rollout, cap), correcting for a rollout
    engine whose probabilities differ from the learner's (an inference server's kernels,
    quantization). None: no weighting (the ratio is still logged)."""
    lora_r: int = 0
    """LoRA rank (0: full fine-tuning). With LoRA the reference is the adapter-free model."""
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    bf16: bool = False
    """bf16 compute (autocast; FSDP2 param dtype under ``fsdp``) with fp32 master
    parameters and optimizer state. Applies on any device."""
    fsdp: bool = False
    """Shard policy and reference with FSDP2 (``fully_shard`` per decoder layer and the
    root); needs a multi-process launch. Rollouts gather the full parameters first."""
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"loss_agg must be token-mean or seq-mean-token-mean, got {self.loss_agg!r}")
        if self.kl_kind not in ("low_var_kl", "k1", "k2"):
            raise ValueError(f"kl_kind must be low_var_kl, k1 or k2, got {self.kl_kind!r}")
        if self.old_logprobs not in ("rollout", "recompute"):
            raise ValueError(f"old_logprobs must be rollout or recompute, got {self.old_logprobs!r}")
        if self.micro_batch_size < 1 or self.mini_batches < 1 or self.ppo_epochs < 1:
            raise ValueError("micro_batch_size, mini_batches and ppo_epochs must be >= 1")
        if self.mini_batch_rows is not None and self.mini_batch_rows < 1:
            raise ValueError(f"mini_batch_rows must be >= 1 or None, got {self.mini_batch_rows}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError("need 0 <= clip_low < 1 and clip_high >= 0")
        if self.tis_cap is not None and (self.tis_cap <= 0 or self.old_logprobs != "recompute"):
            raise ValueError("tis_cap needs old_logprobs: recompute and a cap > 0 (e.g. 2), "
                             f"got tis_cap={self.tis_cap}, old_logprobs={self.old_logprobs}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1 (verl: 3) or None, got {self.clip_ratio_c}")
        if self.lr <= 0 or self.weight_decay < 0 or self.max_grad_norm <= 0:
            raise ValueError("need lr > 0, weight_decay >= 0 and max_grad_norm > 0")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.lora_r < 0 or self.warmup_steps < 0:
            raise ValueError("kl_coef, entropy_coef, lora_r and warmup_steps must be >= 0")


@dataclass(frozen=True)
class Row:
    """One training sequence: a step's prompt and completion, old log-probs, advantage,
    and its weight (0 for the padding rows of rank symmetry)."""

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    old_logprobs: np.ndarray
    advantage: float
    weight: float = 1.0
    is_weight: np.ndarray | None = None
    """Per-token truncated importance weight (``tis_cap``); None: 1."""


def rows_of(table, advantages: np.ndarray) -> list[Row]:
    """The table's rows that have a sampled completion, with their advantages."""
    adv = np.asarray(advantages, dtype=np.float64)
    if len(adv) != len(table):
        raise ValueError(f"{len(adv)} advantages for {len(table)} step rows")
    comp, prompt, lp = table["completion_ids"], table["prompt_ids"], table["logprobs"]
    return [Row(prompt[i], comp[i], lp[i], float(adv[i])) for i in range(len(table))
            if len(comp[i]) > 0]


def pad_batch(rows: list[Row], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded inputs and, for the completion tokens, their ids, old log-probs, mask
    (0 on padding and on zero-weight rows) and the positions of the hidden states that
    predict them. Shapes (B, L) and (B, T)."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    comp = max(len(r.completion_ids) for r in rows)
    B = len(rows)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    targets = torch.full((B, comp), pad_id, dtype=torch.long)
    old = torch.zeros((B, comp))
    isw = torch.ones((B, comp))
    mask = torch.zeros((B, comp))
    positions = torch.zeros((B, comp), dtype=torch.long)
    for b, r in enumerate(rows):
        seq = np.concatenate([r.prompt_ids, r.completion_ids])
        input_ids[b, :len(seq)] = torch.from_numpy(seq.astype(np.int64))
        attention[b, :len(seq)] = 1
        n, p = len(r.completion_ids), len(r.prompt_ids)
        targets[b, :n] = torch.from_numpy(r.completion_ids.astype(np.int64))
        old[b, :n] = torch.from_numpy(np.asarray(r.old_logprobs[:n], dtype=np.float32))
        mask[b, :n] = r.weight
        if r.is_weight is not None:
            isw[b, :n] = torch.from_numpy(np.asarray(r.is_weight[:n], dtype=np.float32))
        positions[b, :n] = torch.arange(p - 1, p - 1 + n)
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    out = dict(input_ids=input_ids, attention_mask=attention, targets=targets, old=old,
               mask=mask, positions=positions, adv=adv, isw=isw)
    return {k: v.to(device) for k, v in out.items()}


def split_even(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` consecutive chunks of near-equal size (some may be empty)."""
    return [list(c) for c in np.array_split(np.asarray(items, dtype=object), parts)] \
        if parts > 0 else []


class Learner:
    """PPO-clip learner over a transformers causal LM, distributed with accelerate."""

    def __init__(self, model: Any, tokenizer: Any, config: LearnerConfig,
                 accelerator: Any = None, reference: Any = None) -> None:
        from accelerate import Accelerator

        self.config, self.tokenizer = config, tokenizer
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        if config.fsdp and self.accelerator.num_processes > 1 and \
                self.accelerator.state.distributed_type.name.startswith("FSDP"):
            raise ValueError("learner.fsdp shards the model itself: launch with a plain "
                             "multi-process accelerate config, not accelerate's FSDP plugin")
        model = _load(model)
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
            ref = _load(reference) if reference is not None else copy.deepcopy(model)
            self.ref_model = ref.eval().requires_grad_(False)
        device = self.accelerator.device
        self.sharded = config.fsdp and self.accelerator.num_processes > 1
        if self.sharded:
            model.to(device)
            _shard(model, config.bf16)
            if self.ref_model is not None:
                self.ref_model.to(device)
                _shard(self.ref_model, config.bf16)
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

    @property
    def unwrapped(self):
        return self.model if self.sharded else self.accelerator.unwrap_model(self.model)

    def autocast(self):
        """bf16 autocast around forward passes (not under FSDP2, which casts itself)."""
        if not self.config.bf16 or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16)

    @contextlib.contextmanager
    def rollout_context(self):
        """Around generation with :attr:`unwrapped`: under FSDP2, every rank gathers the
        full parameters once (forwards then run without collectives, so ranks may generate
        different numbers of tokens), then reshards; bf16 autocast when configured."""
        if not self.sharded:
            with self.autocast():
                yield
            return
        modules = _fsdp_modules(self.model)
        for m in modules:
            m.unshard()
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for m in modules:
                m.set_reshard_after_forward(True, recurse=False)
                m.reshard()

    def set_reference(self) -> None:
        """Make the current policy the KL reference (after the warm-up)."""
        if self.ref_model is None:
            return
        self.ref_model.load_state_dict(self.unwrapped.state_dict())

    def save_reference(self, path: str | Path) -> None:
        """Write the KL reference (a transformers checkpoint) so that a resumed run keeps
        it; nothing under LoRA (the reference is the base model) or without KL."""
        if self.ref_model is None:
            return
        state = (_full_state(self.ref_model) if self.sharded else None)
        if self.accelerator.is_main_process:
            self.ref_model.save_pretrained(Path(path), state_dict=state)
        self.accelerator.wait_for_everyone()

    # ------------------------------------------------------------- forward passes
    def _logprobs(self, model, batch: dict[str, torch.Tensor], with_entropy: bool = False):
        with self.autocast():
            return forward_token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                          batch["positions"], batch["targets"],
                                          self.config.temperature, with_entropy)

    def score(self, prompt_ids, completion_ids, temperature: float) -> np.ndarray:
        """The current policy's log-probs of one completion at ``temperature`` (the
        inference-server probe). Under FSDP2 call it inside :meth:`rollout_context`."""
        row = Row(np.asarray(prompt_ids), np.asarray(completion_ids),
                  np.zeros(len(completion_ids)), 0.0)
        batch = pad_batch([row], self.pad_id, self.accelerator.device)
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

    def _padding_row(self, rows: list[Row]) -> Row:
        if rows:
            r = rows[0]
            return Row(r.prompt_ids, r.completion_ids, r.old_logprobs, 0.0, 0.0)
        dummy = np.asarray([self.pad_id, self.pad_id], dtype=np.int64)
        return Row(dummy[:1], dummy[1:], np.zeros(1), 0.0, 0.0)

    def _micro(self, rows: list[Row], pad: Row) -> list[list[Row]]:
        """Micro-batches of ``rows``, padded to the largest count of any rank."""
        size = self.config.micro_batch_size
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        target = self._global_max(len(chunks))
        return chunks + [[pad]] * (target - len(chunks))

    def _n_mini(self, n_rows: int) -> int:
        if self.config.mini_batch_rows is None:
            return self.config.mini_batches
        total = self._global_sum([float(n_rows)])[0]
        return max(1, math.ceil(total / self.config.mini_batch_rows))

    # ------------------------------------------------------------- update
    def update(self, table, advantages: np.ndarray) -> dict[str, float]:
        """One PPO update on this process's step rows; returns reduced metrics."""
        cfg = self.config
        rows = rows_of(table, advantages)
        pad = self._padding_row(rows)
        gap = 0.0
        ratio = {"sum": 0.0, "max": 0.0, "n": 0.0}
        if cfg.old_logprobs == "recompute":
            rows, gap, ratio = self._recompute_old(rows, pad)
        self.model.train()
        sums: dict[str, float] = {}
        n_mini = self._n_mini(len(rows))
        for _ in range(cfg.ppo_epochs):
            for mini in split_even(rows, n_mini):
                self._step(mini, pad, sums)
        totals = self._global_sum([sums.get(k, 0.0) for k in _SUM_KEYS]
                                  + [gap, float(sum(len(r.completion_ids) for r in rows)),
                                     ratio["sum"], ratio["n"]])
        s = dict(zip(_SUM_KEYS + ("gap", "row_tokens", "ratio_sum", "ratio_n"), totals))
        tokens = max(s["tokens"], 1.0)
        out = {"losses/policy": s["policy"] / max(s["opt_steps"], 1.0),
               "losses/kl": s["kl"] / tokens, "losses/clip_frac": s["clip"] / tokens,
               "losses/grad_norm": s["grad_norm"] / max(s["opt_steps"], 1.0),
               "train/tokens": s["tokens"], "train/opt_steps": s["opt_steps"],
               "train/lr": self.scheduler.get_last_lr()[0]}
        if cfg.entropy_coef > 0 or cfg.log_entropy:
            out["losses/entropy"] = s["entropy"] / tokens
        if cfg.old_logprobs == "recompute":
            # mean |recomputed - sampled| log-prob per token: rollout/learner mismatch
            out["train/rollout_logprob_gap"] = s["gap"] / max(s["row_tokens"], 1.0)
            # pi_learner_old / pi_rollout per token (truncated by tis_cap when set)
            out["train/is_ratio_mean"] = s["ratio_sum"] / max(s["ratio_n"], 1.0)
            out["train/is_ratio_max"] = self._global_max(float(ratio["max"]))
        return out

    def _recompute_old(self, rows: list[Row], pad: Row
                       ) -> tuple[list[Row], float, dict[str, float]]:
        """Old log-probs from a teacher-forced pass under the current parameters; the
        summed absolute difference to the sampled ones; the per-token ratio
        pi_learner_old / pi_rollout (sum, max, count; tokens without a rollout log-prob
        are left out) and, with ``tis_cap``, each token's truncated weight."""
        cap = self.config.tis_cap
        out: list[Row] = []
        self.model.eval()
        gap = 0.0
        ratio = {"sum": 0.0, "max": 0.0, "n": 0.0}
        with torch.no_grad():
            for chunk in self._micro(rows, pad):
                batch = pad_batch(chunk, self.pad_id, self.accelerator.device)
                logp = self._logprobs(self.model, batch)[0].float().cpu().numpy()
                for b, r in enumerate(chunk):
                    if r.weight == 0:
                        continue
                    n = len(r.completion_ids)
                    sampled = np.asarray(r.old_logprobs[:n], dtype=np.float64)
                    known = np.isfinite(sampled)
                    rho = np.exp(logp[b, :n] - np.where(known, sampled, logp[b, :n]))
                    gap += float(np.abs(logp[b, :n] - sampled)[known].sum())
                    if known.any():
                        ratio["sum"] += float(rho[known].sum())
                        ratio["max"] = max(ratio["max"], float(rho[known].max()))
                        ratio["n"] += float(known.sum())
                    out.append(Row(r.prompt_ids, r.completion_ids, logp[b, :n],
                                   r.advantage, r.weight,
                                   np.minimum(rho, cap) if cap is not None else None))
        return out, gap, ratio

    def _step(self, mini: list[Row], pad: Row, sums: dict[str, float]) -> None:
        cfg, acc = self.config, self.accelerator
        local_tokens = float(sum(len(r.completion_ids) for r in mini))
        counts = self._global_sum([local_tokens, float(len(mini))])
        denom = float(counts[0] if cfg.loss_agg == "token-mean" else counts[1])
        denom = max(denom, 1.0) / acc.num_processes  # gradients are averaged over ranks
        chunks = self._micro(mini, pad)
        self.optimizer.zero_grad(set_to_none=True)
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1
            sync = self.sharded or last or acc.num_processes == 1
            with (contextlib.nullcontext() if sync else acc.no_sync(self.model)):
                self._accumulate(chunk, denom, sums)
        norm = _clip_grad_norm(self.model, cfg.max_grad_norm, self.sharded, acc)
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        sums["opt_steps"] = sums.get("opt_steps", 0.0) + 1.0 / acc.num_processes
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm) / acc.num_processes

    def _accumulate(self, chunk: list[Row], denom: float, sums: dict[str, float]) -> None:
        cfg = self.config
        batch = pad_batch(chunk, self.pad_id, self.accelerator.device)
        want_entropy = cfg.entropy_coef > 0 or cfg.log_entropy
        logp, ent = self._logprobs(self.model, batch, want_entropy)
        mask = batch["mask"]
        loss, clip_frac = ppo_clip_loss(logp, batch["old"], batch["adv"], mask, cfg.clip_low,
                                        cfg.clip_high, cfg.loss_agg, denom, cfg.clip_ratio_c,
                                        batch["isw"] if cfg.tis_cap is not None else None)
        n_tok = float(mask.sum())
        policy_part = float(loss.detach()) / self.accelerator.num_processes
        if cfg.kl_coef > 0:
            kl = kl_penalty(logp, self._ref_logprobs(batch), cfg.kl_kind)
            loss = loss + cfg.kl_coef * aggregate(kl, mask, cfg.loss_agg, denom)
            sums["kl"] = sums.get("kl", 0.0) + float((kl.detach() * mask).sum())
        if ent is not None:
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * aggregate(ent, mask, cfg.loss_agg, denom)
            sums["entropy"] = sums.get("entropy", 0.0) + float((ent.detach() * mask).sum())
        self.accelerator.backward(loss)
        sums["policy"] = sums.get("policy", 0.0) + policy_part
        sums["clip"] = sums.get("clip", 0.0) + float(clip_frac) * n_tok
        sums["tokens"] = sums.get("tokens", 0.0) + n_tok

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) model state on every rank's CPU."""
        if not self.sharded:
            return {k: v.detach().cpu() for k, v in self.unwrapped.state_dict().items()}
        return _full_state(self.model)

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

    def save(self, path: str | Path) -> None:
        """Model (or adapter), tokenizer, optimizer, scheduler and RNG states. Under
        ``fsdp`` each rank writes its optimizer shard."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        acc = self.accelerator
        weights = self.state_dict() if self.sharded else None
        if acc.is_main_process:
            self.unwrapped.save_pretrained(path / "model", state_dict=weights)
            self.tokenizer.save_pretrained(path / "model")
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "steps": self.steps, "rng": rng_state()}
        if self.sharded:
            torch.save(state, path / f"trainer_state.rank{acc.process_index}.pt")
        elif acc.is_main_process:
            torch.save(state, path / "trainer_state.pt")
        acc.wait_for_everyone()

    def load_state(self, path: str | Path) -> None:
        """Restore optimizer, scheduler and RNG (the weights are loaded at construction)."""
        name = (f"trainer_state.rank{self.accelerator.process_index}.pt" if self.sharded
                else "trainer_state.pt")
        state = torch.load(Path(path) / name, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        set_rng_state(state["rng"])


_SUM_KEYS = ("policy", "kl", "clip", "entropy", "tokens", "opt_steps", "grad_norm")


def _load(model):
    """A model object in fp32 (fp32 masters) from a path or an object."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        model = model.float()
    return model


def _decoder_layers(model) -> list[torch.nn.Module]:
    names = set(getattr(_inner(model), "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def _inner(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _shard(model, bf16: bool) -> None:
    """FSDP2: each decoder layer, then the root (fp32 masters; bf16 compute if asked)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def _full_state(model) -> dict[str, torch.Tensor]:
    """An FSDP2 module's full state dict on every rank (CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload would leave the other ranks with an empty dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu() for k, v in state.items()}


def _fsdp_modules(model) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _clip_grad_norm(model, max_norm: float, sharded: bool, acc) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not sharded:
        return float(acc.clip_grad_norm_(model.parameters(), max_norm))
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
