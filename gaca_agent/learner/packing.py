"""A micro-batch's rows packed as prefix trees: each shared prompt prefix forwarded once.

A group's episodes of one task share the start of their prompts (the whole prompt at the
first step; the system prompt, the task and the observations while they agree), and the
learner's passes (the recompute, the reference and the policy pass with its backward)
forwarded every row's prompt in full. Packed, the rows that share a prefix make one
sequence: the prefix once, then each row's own prompt tokens and its completion as a
branch. A 4D attention mask lets each branch attend to the prefix and to itself only,
and each token keeps its row's position (the branch continues the prefix's positions),
so every completion token's log-prob is the padded batch's up to rounding, and the
gradient reaches the shared prefix from every branch. Which rows share which prefix is
the rollout's own plan (:func:`gaca_agent.generate.prefix.plan_prefixes`).

``learner.pack_prefixes`` turns it on; it needs an attention that takes a custom 4D mask
(``sdpa`` or ``eager``; FlashAttention ignores it). The plan is a pure function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gaca_agent.learner.batch import PAD, pad_batch

#: Attention implementations that apply a custom 4D mask.
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class PackPlan:
    """Packed sequences and where each row's completion is predicted in them."""

    tokens: tuple[np.ndarray, ...]
    """Per sequence, its token ids."""
    branch: tuple[np.ndarray, ...]
    """Per sequence and token: 0 in the shared prefix, k >= 1 in the k-th row's branch."""
    position_ids: tuple[np.ndarray, ...]
    """Per sequence and token: the token's position in its own row."""
    sequence_of: tuple[int, ...]
    """Per row, its sequence."""
    predicts: tuple[np.ndarray, ...]
    """Per row, the index in its sequence of the token that predicts each completion
    token (the completion's first token is predicted by the prompt's last)."""


def plan_packing(prompts: Sequence[Sequence[int]],
                 completions: Sequence[Sequence[int]]) -> PackPlan:
    """Rows (non-empty prompts) packed by their shared prompt prefixes."""
    from gaca_agent.generate.prefix import plan_prefixes

    prefixes = plan_prefixes([list(p) for p in prompts])
    tokens, branch, position, sequence_of, predicts = [], [], [], [0] * len(prompts), \
        [np.zeros(0, dtype=np.int64)] * len(prompts)
    for s, (shared, members) in enumerate(zip(prefixes.lengths, prefixes.members)):
        head = np.asarray(prompts[members[0]][:shared], dtype=np.int64)
        ids, kind, pos = [head], [np.zeros(shared, dtype=np.int64)], [np.arange(shared)]
        at = shared
        for k, i in enumerate(members, start=1):
            prompt, comp = np.asarray(prompts[i], dtype=np.int64), np.asarray(
                completions[i], dtype=np.int64)
            own = np.concatenate([prompt[shared:], comp])
            ids.append(own)
            kind.append(np.full(len(own), k, dtype=np.int64))
            pos.append(np.arange(shared, len(prompt) + len(comp)))
            sequence_of[i] = s
            # row position q (>= shared: the prompt's last token is its own) -> at + q - shared
            predicts[i] = at + np.arange(len(prompt) - 1, len(prompt) - 1 + len(comp)) - shared
            at += len(own)
        tokens.append(np.concatenate(ids))
        branch.append(np.concatenate(kind))
        position.append(np.concatenate(pos))
    return PackPlan(tuple(tokens), tuple(branch), tuple(position), tuple(sequence_of),
                    tuple(predicts))


def tree_mask(branch: torch.Tensor) -> torch.Tensor:
    """(S, L) branch ids (-1 on padding) -> (S, 1, L, L) bool: a token attends to the
    tokens before it in the prefix and in its own branch, padding to itself only (a row
    with nothing to attend to would give NaN)."""
    L = branch.shape[1]
    q, k = branch.unsqueeze(2), branch.unsqueeze(1)
    causal = torch.ones(L, L, dtype=torch.bool, device=branch.device).tril()
    same = ((k == 0) | (k == q)) & (k >= 0) & (q >= 0)
    eye = torch.eye(L, dtype=torch.bool, device=branch.device)
    return ((same & causal) | eye).unsqueeze(1)


def pack_batch(table, rows: np.ndarray, pad_id: int, device,
               additive: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """:func:`gaca_agent.learner.batch.pad_batch`'s columns for ``rows`` (targets, old
    log-probs, mask, advantages, weights: one row each) with packed inputs: (S, L)
    ``input_ids`` and ``position_ids``, the (S, 1, L, L) tree mask (bool; additive in
    ``additive`` for eager attention), and per row its sequence (``sequence_of``) and the
    indices that predict its completion (``positions``). A :data:`PAD` row packs alone."""
    batch = pad_batch(table, rows, pad_id, device)
    prompts, comps = table["prompt_ids"], table["completion_ids"]
    dummy = [pad_id]
    plan = plan_packing([prompts[i] if i != PAD else dummy for i in rows],
                        [comps[i] if i != PAD else dummy for i in rows])
    S, L = len(plan.tokens), max(len(t) for t in plan.tokens)
    ids = torch.full((S, L), pad_id, dtype=torch.long)
    branch = torch.full((S, L), -1, dtype=torch.long)
    position_ids = torch.zeros((S, L), dtype=torch.long)
    for s, (t, b, p) in enumerate(zip(plan.tokens, plan.branch, plan.position_ids)):
        ids[s, :len(t)], branch[s, :len(t)] = torch.from_numpy(t), torch.from_numpy(b)
        position_ids[s, :len(t)] = torch.from_numpy(p)
    positions = torch.zeros_like(batch["positions"], device="cpu")
    for r, at in enumerate(plan.predicts):
        positions[r, :len(at)] = torch.from_numpy(at)
    mask = tree_mask(branch)
    if additive is not None:
        mask = torch.zeros(mask.shape, dtype=additive).masked_fill(
            ~mask, torch.finfo(additive).min)
    packed = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                  positions=positions, sequence_of=torch.as_tensor(plan.sequence_of))
    return {**batch, **{k: v.to(device) for k, v in packed.items()}}


def micro_inputs(table, rows: np.ndarray, pad_id: int, device,
                 packed_for=None) -> dict[str, torch.Tensor]:
    """The learner's tensors for a micro-batch: :func:`pad_batch`, or with ``packed_for``
    (the model) :func:`pack_batch`, its mask additive where the attention is eager."""
    if packed_for is None:
        return pad_batch(table, rows, pad_id, device)
    eager = packed_for.config._attn_implementation == "eager"
    dtype = next(packed_for.parameters()).dtype
    return pack_batch(table, rows, pad_id, device, dtype if eager else None)


def prompt_order(table, rows: np.ndarray) -> np.ndarray:
    """``rows`` sorted by their prompts' token ids, so that rows of a shared prefix are
    neighbours and share a micro-batch."""
    prompts = table["prompt_ids"]
    rows = np.asarray(rows, dtype=np.int64)
    return rows[sorted(range(len(rows)), key=lambda k: tuple(prompts[rows[k]].tolist()))]


def check_attention(model) -> None:
    """Refuse packing where the model's attention would ignore the tree mask."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in MASKED_ATTENTION:
        raise ValueError(f"learner.pack_prefixes needs {' or '.join(MASKED_ATTENTION)} "
                         f"attention (a custom 4D mask); this model uses {impl!r}: set "
                         "learner.pack_prefixes: false")
