"""The learner's settings (a section of ``gaca-train``'s config; no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Agg = Literal["token-mean", "seq-mean-token-mean"]
KLKind = Literal["low_var_kl", "k1", "k2"]
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
    temperature: float | None = None
    """The temperature the rollouts were sampled at: log-probs are recomputed at it
    (<= 0, greedy decoding, and None: 1, the temperature-1 log-probs greedy rollouts
    record). ``gaca-train`` sets it from ``model.temperature`` and refuses another value."""
    old_logprobs: OldLogprobs = "rollout"
    """``rollout``: the engine's sampled log-probs; ``recompute``: a teacher-forced pass by
    the learner before the update (as verl; use it when rollout kernels differ)."""
    tis_cap: float | None = None
    """Truncated importance sampling (with ``old_logprobs: recompute``): each token's policy
    loss is weighted by min(pi_learner_old / pi_rollout, cap), correcting for a rollout
    engine whose probabilities differ from the learner's (an inference server's kernels,
    quantization) and for rollouts sampled by older weights (``max_staleness``). None: no
    weighting (the ratio is still logged). See docs/algorithms.md, "Off-policy correction"."""
    is_mask: tuple[float, float] | None = None
    """[low, high]: a token whose pi_learner_old / pi_rollout lies outside gets weight 0
    (IcePop's token mask); inside, its weight is the ratio (truncated at ``tis_cap``)."""
    is_geo_mask: tuple[float, float] | None = None
    """[low, high]: a step whose geometric-mean ratio over its tokens lies outside gets
    weight 0 on every token (verl's Geo-RS)."""
    lora_r: int = 0
    """LoRA rank (0: full fine-tuning). With LoRA the reference is the adapter-free model."""
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    bf16: bool | Literal["auto"] = False
    """bf16 compute (autocast; FSDP2 param dtype under ``fsdp``) with fp32 master
    parameters and optimizer state. ``true`` applies on any device (with a warning where
    the device has no bf16 matrix units: there it is slower than fp32); ``auto`` is bf16
    only where it is native (a GPU since Ampere, a CPU with AVX512-BF16 or AMX), else fp32
    (:mod:`gaca_agent.learner.precision`)."""
    fsdp: bool = False
    """Shard policy and reference with FSDP2 (``fully_shard`` per decoder layer and the
    root); needs a multi-process launch. Rollouts gather the full parameters first."""
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.loss_agg not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"loss_agg must be token-mean or seq-mean-token-mean, got {self.loss_agg!r}")
        if self.kl_kind not in ("low_var_kl", "k1", "k2"):
            raise ValueError(f"kl_kind must be low_var_kl, k1 or k2, got {self.kl_kind!r}")
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f"bf16 must be true, false or auto, got {self.bf16!r}")
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
        for name in ("is_mask", "is_geo_mask"):
            band = getattr(self, name)
            if band is None:
                continue
            if len(band) != 2 or not 0 <= band[0] < 1 < band[1]:
                raise ValueError(f"{name} must be [low, high] with 0 <= low < 1 < high (e.g. "
                                 f"[0.5, 2]), got {list(band)}")
            if self.old_logprobs != "recompute":
                raise ValueError(f"{name} needs old_logprobs: recompute")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1 (verl: 3) or None, got {self.clip_ratio_c}")
        if self.lr <= 0 or self.weight_decay < 0 or self.max_grad_norm <= 0:
            raise ValueError("need lr > 0, weight_decay >= 0 and max_grad_norm > 0")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.lora_r < 0 or self.warmup_steps < 0:
            raise ValueError("kl_coef, entropy_coef, lora_r and warmup_steps must be >= 0")

    @property
    def policy_loss_only(self) -> bool:
        """The loss is the PPO term alone (rows with advantage 0 have no gradient)."""
        return self.kl_coef == 0 and self.entropy_coef == 0 and not self.log_entropy

    @property
    def scoring_temperature(self) -> float:
        """The temperature log-probs are computed at (:attr:`temperature`, 1 when unset
        or greedy)."""
        t = self.temperature
        return t if t is not None and t > 0 else 1.0

    @property
    def correction(self):
        """The off-policy correction these settings ask for (learner/correction.py)."""
        from gaca_agent.learner.correction import Correction

        return Correction(self.tis_cap, None if self.is_mask is None else tuple(self.is_mask),
                          None if self.is_geo_mask is None else tuple(self.is_geo_mask))
