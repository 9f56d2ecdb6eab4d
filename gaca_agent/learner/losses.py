"""Policy-loss maths as small pure functions over tensors and masks.

Shapes: B sequences x T completion tokens. ``mask`` is 1 on a step's response tokens
(0 on padding and on tokens after the first EOS); ``adv`` is (B,) and broadcast to the
tokens of its sequence (a step's advantage covers its whole response).

KL estimators are registered by name (:data:`KL_ESTIMATORS`, as verl's ``core_algos``):
``learner.kl_kind`` selects one, so a new one is a function here and a ``@register`` line.
The policy loss is one function, :func:`ppo_clip_loss` (the decoupled objective's
importance weights come in as ``isw``).
"""

from __future__ import annotations

from typing import Callable

import torch

from gaca_agent.learner.config import Agg, KLKind

#: Per-token KL estimators by name: (logp, ref_logp) -> per-token KL.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register(table: dict, name: str):
    """A decorator adding a function to ``table`` under ``name``."""
    def add(fn):
        table[name] = fn
        return fn
    return add


def lookup(table: dict, name: str, what: str):
    """``table[name]``, or a ValueError naming ``what`` and the registered names."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; registered: {sorted(table)}") from None


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: Agg,
              denominator: float | None = None) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    ``token-mean``: sum over all tokens / number of tokens; ``seq-mean-token-mean``: the
    mean over sequences of each sequence's token mean. ``denominator`` replaces the local
    count (tokens, or sequences) so that micro-batches sum to the full batch's value.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        total = (values * mask).sum()
        return total / (denominator if denominator is not None else mask.sum().clamp(min=1))
    if mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        n = denominator if denominator is not None else max(values.shape[0], 1)
        return per_seq.sum() / n
    raise ValueError(f"loss aggregation must be token-mean or seq-mean-token-mean, got {mode!r}")


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                  mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                  agg: Agg = "token-mean", denominator: float | None = None,
                  clip_ratio_c: float | None = None, weights: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate with separate low/high clip (DAPO's clip-higher) and an
    optional dual clip.

    L = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = exp(logp - old_logp);
    with ``clip_ratio_c`` = c (dual-clip PPO, Ye et al. 2020; verl's c = 3), a token with
    A < 0 has L = min(L, -c A): a very large ratio cannot make its loss unbounded.
    ``weights`` (B, T) multiply each token's loss (truncated importance sampling between
    the rollout engine and the learner). Returns (loss, fraction of response tokens where
    a clip was active).
    """
    a = adv.unsqueeze(-1).to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    per_token = -torch.minimum(unclipped, clipped)
    active = clipped < unclipped
    if clip_ratio_c is not None:
        cap = -clip_ratio_c * a
        dual = (a < 0) & (per_token > cap)
        per_token = torch.where(dual, cap.expand_as(per_token), per_token)
        active = active | dual
    if weights is not None:
        per_token = per_token * weights.to(per_token.dtype)
    clip_frac = (active.to(logp.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return aggregate(per_token, mask, agg, denominator), clip_frac.detach()


@register(KL_ESTIMATORS, "k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """logp - ref."""
    return logp - ref_logp


@register(KL_ESTIMATORS, "k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(logp - ref)^2 / 2."""
    return 0.5 * (logp - ref_logp).pow(2)


@register(KL_ESTIMATORS, "low_var_kl")
def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 (Schulman): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] as verl does."""
    neg = ref_logp - logp
    return torch.clamp(torch.exp(neg) - neg - 1.0, -10.0, 10.0)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "low_var_kl"
               ) -> torch.Tensor:
    """Per-token KL estimate to the reference policy (see :data:`KL_ESTIMATORS`)."""
    return lookup(KL_ESTIMATORS, kind, "kl kind")(logp, ref_logp)
