"""The tabular policy a language model induces on a diagnostic world, for exact values.

A diagnostic world is a small MDP (:mod:`gaca_envs.diag`), so a model's policy on it can be
written down: in every state, the probability of each admissible action. Here that
probability is the model's probability (at the sampling temperature) of the well-formed
answer naming the action (``<think></think><action>a</action>`` and end-of-sequence, the
answer the warm-up teaches), renormalised over the state's actions. The prompt is the one
a rollout shows (:class:`~gaca_agent.policies.hf.HFPolicy`'s chat, no history) at the
step at which the state is first reached: the prompt counts steps, so after a rest or a
jammed door the real policy sees a later step count than this table assumes. Answers
that are not of this form (other thoughts, unparsable text) are left out; the share of
probability the well-formed answers hold is returned beside the table.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from gaca_agent.generate.families import family_of
from gaca_agent.generate.prompts import format_response
from gaca_agent.types import Turn


def first_steps(mdp) -> list[int]:
    """Per state, the fewest steps from the start to it (breadth-first; -1: unreachable)."""
    depth = [-1] * mdp.num_states
    depth[mdp.start] = 0
    queue = deque([mdp.start])
    while queue:
        s = queue.popleft()
        for outs in mdp.outcomes[s]:
            for o in outs:
                if not o.terminal and depth[o.next_state] < 0:
                    depth[o.next_state] = depth[s] + 1
                    queue.append(o.next_state)
    return depth


def state_turn(mdp, s: int, env_id: str, step: int) -> Turn:
    """The turn a rollout shows in state ``s`` at ``step`` with no history."""
    shown = tuple(sorted(mdp.actions[s]))  # the env lists its actions sorted
    return Turn(env_id, mdp.task, mdp.observations[s], shown, (), step,
                family=family_of(env_id))


def answer_logprobs(policy, turns: list[Turn], answers: list[str]) -> np.ndarray:
    """log p(answer + EOS | turn's prompt) under ``policy``'s model at its temperature,
    one per (turn, answer) pair, in one padded forward pass."""
    import torch

    from gaca_agent.learner.logprobs import logprobs_from_logits

    tok, model = policy.tokenizer, policy.model
    seqs = []
    for turn, answer in zip(turns, answers):
        prompt = list(policy.prompt_ids(turn))
        reply = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append((prompt, reply))
    width = max(len(p) + len(r) for p, r in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, (p, r) in enumerate(seqs):
        ids[b, :len(p) + len(r)] = torch.tensor(p + r)
        attn[b, :len(p) + len(r)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids.to(policy.device),
                       attention_mask=attn.to(policy.device)).logits.float()
    out = np.zeros(len(seqs))
    for b, (p, r) in enumerate(seqs):
        steps = logits[b, len(p) - 1:len(p) + len(r) - 1]
        targets = torch.tensor(r, device=steps.device)
        out[b] = float(logprobs_from_logits(steps, targets, policy.temperature).sum())
    return out


def model_policy(policy, mdp, env_id: str) -> tuple[list[np.ndarray], np.ndarray]:
    """(pi, mass): ``pi[s]`` over ``mdp.actions[s]`` (indexed as the MDP indexes them) and
    ``mass[s]``, the probability the well-formed answers hold before renormalising. States
    that cannot be reached get the uniform policy and mass NaN."""
    depth = first_steps(mdp)
    turns, answers, where = [], [], []
    for s in range(mdp.num_states):
        if depth[s] < 0:
            continue
        turn = state_turn(mdp, s, env_id, depth[s])
        for a, text in enumerate(mdp.actions[s]):
            turns.append(turn)
            answers.append(format_response(text))
            where.append((s, a))
    logp = answer_logprobs(policy, turns, answers) if turns else np.zeros(0)
    pi = [np.full(len(a), 1.0 / len(a)) for a in mdp.actions]
    mass = np.full(mdp.num_states, np.nan)
    grouped: dict[int, list[tuple[int, float]]] = {}
    for (s, a), lp in zip(where, logp):
        grouped.setdefault(s, []).append((a, lp))
    for s, pairs in grouped.items():
        lps = np.array([lp for _, lp in pairs])
        top = lps.max()
        weights = np.exp(lps - top)
        pi[s] = np.zeros(len(mdp.actions[s]))
        for (a, _), w in zip(pairs, weights / weights.sum()):
            pi[s][a] = w
        mass[s] = float(np.exp(top) * weights.sum())
    return pi, mass


def load_policy(model_dir: str, temperature: float, tokenizer_dir: str | None = None) -> Any:
    """An :class:`HFPolicy` of a saved model (a run's ``final/model`` or ``reference``;
    ``reference`` holds no tokenizer, so pass the run's ``final/model`` as ``tokenizer_dir``)."""
    from transformers import AutoTokenizer

    from gaca_agent.policies.hf import HFPolicy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    return HFPolicy(model_dir, tokenizer, temperature=temperature, history_length=0,
                    device="cpu")
