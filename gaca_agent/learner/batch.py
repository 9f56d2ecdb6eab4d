"""Loss tensors straight from a step table's columns.

A micro-batch is an array of row indices into the table the learner trains on (its
``prompt_ids``, ``completion_ids``, ``logprobs``, ``advantage`` and, with truncated
importance sampling, ``is_weight`` columns); index ``-1`` is a zero-weight padding row
(rank symmetry: every rank runs the same number of forward and backward passes).
"""

from __future__ import annotations

import numpy as np
import torch

#: The index of a zero-weight padding row in a micro-batch.
PAD = -1


def with_advantages(table, advantages: np.ndarray):
    """``table`` with its ``advantage`` column set (one advantage per row)."""
    adv = np.asarray(advantages, dtype=np.float64)
    if len(adv) != len(table):
        raise ValueError(f"{len(adv)} advantages for {len(table)} step rows")
    return table.with_columns(advantage=adv)


def sampled_rows(table) -> np.ndarray:
    """Indices of the rows that have a sampled completion (the ones the loss sees)."""
    return np.flatnonzero(table["completion_ids"].lengths() > 0)


def rows_with_gradient(table, rows: np.ndarray, policy_loss_only: bool) -> np.ndarray:
    """The rows of ``rows`` whose loss has a gradient. With the PPO term alone
    (``policy_loss_only``: no KL or entropy term, entropy not logged) a row whose advantage
    is 0 adds exactly 0 to the loss and its gradient, and is never clipped: it need not be
    forwarded, as long as the loss's denominator still counts its tokens. Sparse rewards
    make most rows such rows (groups whose episodes all scored the same)."""
    if not policy_loss_only:
        return rows
    return rows[np.asarray(table["advantage"])[rows] != 0]


def identical_rows(table, rows: np.ndarray) -> dict[int, np.ndarray]:
    """The rows of ``rows`` by their token ids: for the first row of each distinct
    (prompt, completion) pair, every row of ``rows`` with the same pair (itself first), in
    the order of ``rows``. A forward pass of the same ids gives the same log-probs, so
    the learner forwards each pair once and lets the loss see every row with its own
    advantage, old log-probs and weights. A group's episodes that act alike make such
    rows (the same first prompt; the same history while they agree)."""
    prompts, comps = table["prompt_ids"], table["completion_ids"]
    first: dict[tuple[bytes, bytes], int] = {}
    kin: dict[int, list[int]] = {}
    for i in np.asarray(rows, dtype=np.int64).tolist():
        key = (np.asarray(prompts[i], dtype=np.int64).tobytes(),
               np.asarray(comps[i], dtype=np.int64).tobytes())
        kin.setdefault(first.setdefault(key, i), []).append(i)
    return {i: np.asarray(same, dtype=np.int64) for i, same in kin.items()}


def with_kin(chunk: np.ndarray, kin: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A micro-batch of distinct rows (:func:`identical_rows`' keys, or :data:`PAD`)
    widened to all their rows: (the rows, for each the position in ``chunk`` of the row
    whose forward pass it shares)."""
    rows, index = [], []
    for b, i in enumerate(np.asarray(chunk).tolist()):
        same = kin[i] if i != PAD else np.asarray([PAD])
        rows.append(same)
        index += [b] * len(same)
    return np.concatenate(rows), np.asarray(index, dtype=np.int64)


def pad_batch(table, rows: np.ndarray, pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded inputs and, for the completion tokens, their ids, old log-probs, mask
    (0 on padding and on padding rows) and the positions of the hidden states that
    predict them, for the table rows ``rows``. Shapes (B, L) and (B, T)."""
    prompts, comps, olds = table["prompt_ids"], table["completion_ids"], table["logprobs"]
    isws = table.ragged.get("is_weight")
    dummy = np.asarray([pad_id], dtype=np.int64)
    seqs = [(prompts[i], comps[i]) if i != PAD else (dummy, dummy) for i in rows]
    width = max(len(p) + len(c) for p, c in seqs)
    T = max(len(c) for _, c in seqs)
    B = len(seqs)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    old = torch.zeros((B, T))
    isw = torch.ones((B, T))
    mask = torch.zeros((B, T))
    positions = torch.zeros((B, T), dtype=torch.long)
    adv = torch.zeros(B)
    for b, (i, (prompt, comp)) in enumerate(zip(rows, seqs)):
        n, p = len(comp), len(prompt)
        input_ids[b, :p + n] = torch.from_numpy(np.concatenate([prompt, comp]).astype(np.int64))
        attention[b, :p + n] = 1
        targets[b, :n] = torch.from_numpy(comp.astype(np.int64))
        positions[b, :n] = torch.arange(p - 1, p - 1 + n)
        if i == PAD:
            continue
        old[b, :n] = torch.from_numpy(np.asarray(olds[i][:n], dtype=np.float32))
        mask[b, :n] = 1.0
        adv[b] = float(table["advantage"][i])
        if isws is not None:
            isw[b, :n] = torch.from_numpy(np.asarray(isws[i][:n], dtype=np.float32))
    out = dict(input_ids=input_ids, attention_mask=attention, targets=targets, old=old,
               mask=mask, positions=positions, adv=adv, isw=isw)
    return {k: v.to(device) for k, v in out.items()}


def split_even(rows: np.ndarray, parts: int) -> list[np.ndarray]:
    """``rows`` in ``parts`` consecutive chunks of near-equal size (some may be empty)."""
    return np.array_split(np.asarray(rows, dtype=np.int64), parts) if parts > 0 else []


def micro_batches(rows: np.ndarray, size: int, target: int,
                  lengths: np.ndarray | None = None) -> list[np.ndarray]:
    """``rows`` in chunks of ``size`` (by ``lengths``, each row's tokens, where given:
    each chunk is padded to its longest row, so rows of similar length share one), then
    padding chunks up to ``target`` chunks."""
    if lengths is not None:
        rows = np.asarray(rows)[np.argsort(np.asarray(lengths)[rows], kind="stable")]
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    return chunks + [np.asarray([PAD])] * (target - len(chunks))
