"""Transcripts of played episodes as supervised pairs: each step's prompt exactly as RL
builds it (the chat template, the history) and the action taken, in the response format,
as the target (the warm-up's data: :mod:`gaca_agent.learner.warmup`)."""

from __future__ import annotations

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
