"""Behaviour-cloning warm-up: supervised fine-tuning on transcripts of a policy's episodes
(:func:`gaca_agent.generate.transcripts.transcripts`).

Each step's prompt (exactly as RL builds it: chat template, history) is paired with
``<think></think><action>a</action>`` and the model is trained with cross-entropy on those
response tokens. Transcripts of the *random* policy (uniform admissible actions) teach the
response format only, and RL has to learn which action is good; the *expert*'s (the env's
planner, gold path or walkthrough) are supervised fine-tuning on its trajectories.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import numpy as np
import torch


def pair_table(pairs):
    """The (prompt ids, response ids) pairs as the learner's token rows, each a row that
    :func:`~gaca_agent.learner.batch.pad_batch` pads like an update's."""
    from gaca_agent.learner.batch import with_advantages
    from gaca_agent.steps import StepTable

    table = StepTable.from_tokens([p for p, _ in pairs], [r for _, r in pairs],
                                  [np.zeros(len(r)) for _, r in pairs])
    return with_advantages(table, np.zeros(len(pairs)))


def epoch_batches(n: int, batch: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """(steps, batch) row indices: passes over all ``n`` rows, each a fresh shuffle, cut
    into batches (a batch may span two passes). Every row is seen once in each pass, so
    ``steps * batch / n`` is the warm-up's number of epochs; drawing rows independently
    would leave a third of them unseen after one epoch's worth of steps."""
    if n < 1:
        raise ValueError("the warm-up has no (prompt, response) pairs to train on")
    passes = -(-steps * batch // n)
    order = np.concatenate([rng.permutation(n) for _ in range(passes)]) if passes else \
        np.zeros(0, dtype=int)
    return order[:steps * batch].reshape(steps, batch)


def behaviour_clone(model, tokenizer, pairs, steps: int, batch: int, lr: float, seed: int,
                    device, micro_batch: int | None = None,
                    on_step: Callable[[int, float], None] | None = None,
                    autocast: Callable[[], ContextManager] = contextlib.nullcontext
                    ) -> dict[str, Any]:
    """Adam on the response tokens' cross-entropy (mean over a batch's response tokens),
    batches taken from shuffled passes over the pairs (:func:`epoch_batches`), each
    batch's gradient accumulated over micro-batches of ``micro_batch`` rows of similar
    length (the learner's; a model's activations for 8 rows of 1,000 tokens exceed 16
    GB); returns the first and last losses; ``on_step(step, loss)`` after each step
    (progress). The vocabulary's logits exist a chunk of tokens at a time
    (:mod:`gaca_agent.learner.logprobs`). ``autocast`` (the learner's) is entered around
    each forward pass only: an autocast region caches its bf16 casts of the weights, so
    one spanning several optimizer steps would keep computing with the first step's
    weights while the fp32 masters move."""
    from gaca_agent.learner.batch import pad_batch
    from gaca_agent.learner.logprobs import forward_token_logprobs

    table = pair_table(pairs)
    lengths = table["prompt_ids"].lengths() + table["completion_ids"].lengths()
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    step_rows = micro_batch or batch
    model.train()
    losses = []
    for chosen in epoch_batches(len(pairs), batch, steps, rng):
        # micro-batches of rows of similar length: each is padded to its longest row
        chosen = chosen[np.argsort(lengths[chosen], kind="stable")]
        tokens = sum(len(pairs[i][1]) for i in chosen)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for start in range(0, batch, step_rows):
            b = pad_batch(table, chosen[start:start + step_rows], tokenizer.pad_token_id,
                          device)
            with autocast():
                logp, _ = forward_token_logprobs(model, b["input_ids"], b["attention_mask"],
                                                 b["positions"], b["targets"])
            loss = -(logp * b["mask"]).sum() / tokens
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
        if on_step is not None:
            on_step(len(losses), total)
    model.eval()
    return {"warmup/first_loss": losses[0] if losses else 0.0,
            "warmup/last_loss": float(np.mean(losses[-10:])) if losses else 0.0,
            "warmup/pairs": len(pairs),
            "warmup/epochs": steps * batch / len(pairs)}
