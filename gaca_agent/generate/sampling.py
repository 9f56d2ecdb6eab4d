"""Sampling that depends on each row's own key, not on the batch it shares.

A rollout row (one environment's turn) may carry a key: (episode seed, member of the task
group, step). Its token at position j is drawn by inverse-CDF sampling from
softmax(logits / T) with one uniform number u = U(key, j) from a counter-based generator
(SplitMix64 finaliser over the key and the position). The draw therefore depends only on
the row's own logits, key and position: the same episode samples the same response
whether it shares a batch with 3 rows or 63, in a fresh evaluation or a resumed one, on
any device. Rows without a key draw u from torch's global generator (so
``torch.manual_seed`` still makes a whole run reproducible).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

_MASK64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """SplitMix64's finaliser on a Python int (64-bit, unsigned)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_key(*parts: int) -> int:
    """A 63-bit key from integers (episode seed, group member, step, ...): it fits the
    ``seed`` of the chat API (a signed 64-bit integer), so a served model samples a turn
    with the trainer's own key (:mod:`gaca_agent.serving.app`)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(int(p).to_bytes(16, "little", signed=True))
    return int.from_bytes(h.digest(), "little") >> 1


def key_uniform(key: int, position: int) -> float:
    """U(key, position) in (0, 1): 53 random bits, never 0 or 1."""
    bits = _splitmix(_splitmix(key) ^ _splitmix(position + 0x9E3779B97F4A7C15)) >> 11
    return (bits + 0.5) / float(1 << 53)


def draw_uniforms(keys: Sequence[int | None], position: int, device) -> torch.Tensor:
    """One uniform per row (float64, (B,)): keyed rows from :func:`key_uniform`, the
    others from torch's global generator."""
    u = torch.rand(len(keys), dtype=torch.float64)
    for i, key in enumerate(keys):
        if key is not None:
            u[i] = key_uniform(key, position)
    return u.to(device)


def sample_tokens(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor
                  ) -> torch.Tensor:
    """Inverse-CDF draw from softmax(logits / T) per row: (B, V), (B,) -> (B,) int64.

    The CDF is accumulated in float64 so that rounding cannot shift probability mass
    between tokens; ``temperature`` <= 0 decodes greedily (argmax).
    """
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    chosen = torch.searchsorted(cdf, target).squeeze(-1)
    return chosen.clamp_(max=logits.shape[-1] - 1)
