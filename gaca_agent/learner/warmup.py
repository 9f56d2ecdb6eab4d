"""Behaviour-cloning warm-up: supervised fine-tuning on transcripts of a policy's episodes.

Each step's prompt (exactly as RL builds it: chat template, history) is paired with
``<think></think><action>a</action>`` and the model is trained with cross-entropy on those
response tokens. Transcripts of the *random* policy (uniform admissible actions) teach the
response format only, and RL has to learn which action is good; the *expert*'s (the env's
planner, gold path or walkthrough) are supervised fine-tuning on its trajectories.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gaca_agent.generate.prompts import PromptBuilder, format_response
from gaca_agent.types import Turn


def transcripts(rollout, env_id: str, family: str, builder: PromptBuilder, tokenizer
                ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) for every step of the rollout's episodes."""
    table = rollout.table
    pairs = []
    for ep in rollout.episodes:
        history: list[tuple[str, str]] = []
        for i in ep.rows:
            obs, action = table["observation"][i], table["action_text"][i]
            turn = Turn(env_id, ep.task, obs, tuple(table["admissible_actions"][i]),
                        tuple(history), len(history), family=family)
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": builder.build(turn)}], tokenize=False,
                add_generation_prompt=True)
            p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            r_ids = tokenizer(format_response(action), add_special_tokens=False)["input_ids"]
            pairs.append((p_ids, r_ids + [tokenizer.eos_token_id]))
            history.append((obs, action))
    return pairs


def behaviour_clone(model, tokenizer, pairs, steps: int, batch: int, lr: float, seed: int,
                    device) -> dict[str, Any]:
    """Adam on response-token cross-entropy; returns the first and last losses."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    pad = tokenizer.pad_token_id
    model.train()
    losses = []
    for _ in range(steps):
        chosen = [pairs[i] for i in rng.integers(len(pairs), size=batch)]
        width = max(len(p) + len(r) for p, r in chosen)
        ids = torch.full((batch, width), pad, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attn = torch.zeros((batch, width), dtype=torch.long)
        for b, (p, r) in enumerate(chosen):
            seq = p + r
            ids[b, :len(seq)] = torch.tensor(seq)
            attn[b, :len(seq)] = 1
            labels[b, len(p):len(seq)] = torch.tensor(r)
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device),
                    labels=labels.to(device))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    model.eval()
    return {"warmup/first_loss": losses[0] if losses else 0.0,
            "warmup/last_loss": float(np.mean(losses[-10:])) if losses else 0.0,
            "warmup/pairs": len(pairs)}
