"""The tabular policy a language model induces on a diagnostic world (claims 2 and 3 with
trained checkpoints as behaviour policies)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch", reason="the tabular policy scores a model: pip install -e '.[train]'")

ENV = "gaca/Diag-Pivots-v0"


@pytest.fixture(scope="module")
def policy():
    from gaca_agent.analysis.tabular import load_policy
    from gaca_agent.policies.tiny_model import cached_tiny_model

    path = str(cached_tiny_model(0))
    return load_policy(path, temperature=0.7)


def test_the_table_asks_the_model_with_the_prompts_a_rollout_shows(policy):
    """Played through the collector, every turn at a state first reached on the shortest
    path gives the same prompt tokens as the table's turn for that state."""
    from gaca_agent.analysis.tabular import first_steps, state_turn
    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection
    from gaca_agent.policies import make_policy
    from gaca_envs.diag.env import build_world
    from gaca_envs.diag.env import TRAIN_TASKS

    seen = []
    expert = make_policy("expert")

    class Recording:
        needs_expert = True

        def act(self, turns):
            seen.extend(turns)
            return expert.act(turns)

    collector = Collector(EnvSection(id=ENV, kwargs={"split": "test", "level": 3},
                                     max_live_envs=2, history_length=0))
    try:
        collector.run(Recording(), [(0, 1), (1, 2)], group_size=1)
    finally:
        collector.close()
    mdps = {t: build_world("pivots", TRAIN_TASKS + t, 3) for t in (0, 1)}
    compared = 0
    for turn in seen:
        for mdp in mdps.values():
            depth = first_steps(mdp)
            for s in range(mdp.num_states):
                if mdp.observations[s] == turn.observation and depth[s] == turn.step:
                    mine = state_turn(mdp, s, ENV, depth[s])
                    assert policy.prompt_ids(mine) == policy.prompt_ids(turn)
                    compared += 1
    assert compared >= 30  # two 21-segment episodes, jams aside


def test_answer_logprobs_match_one_sequence_at_a_time_at_the_temperature(policy):
    """The padded batch scores equal an unpadded forward per answer, at temperature 0.7."""
    import torch

    from gaca_agent.analysis.tabular import answer_logprobs, state_turn
    from gaca_envs.diag.env import build_world

    mdp = build_world("pivots", 50, 3)
    turns = [state_turn(mdp, s, ENV, k) for k, s in enumerate((0, 1, 2))]
    answers = ["<think></think><action>walk forward</action>", "<think></think><action>rest"
               "</action>", "<think>hm</think><action>open the door the sign shows</action>"]
    got = answer_logprobs(policy, turns, answers)
    tok = policy.tokenizer
    for turn, answer, value in zip(turns, answers, got):
        prompt = list(policy.prompt_ids(turn))
        reply = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
        lp = torch.log_softmax(logits[len(prompt) - 1:-1] / 0.7, -1)
        expected = float(lp[torch.arange(len(reply)), torch.tensor(reply)].sum())
        assert value == pytest.approx(expected, abs=1e-4)


def test_the_table_is_a_policy_over_each_states_actions(policy, monkeypatch):
    """Each reachable state is asked once per action, at the step it is first reached
    (the tiny random model barely reads the step count, so the turns are checked)."""
    from gaca_agent.analysis import tabular
    from gaca_agent.analysis.tabular import answer_logprobs, first_steps, model_policy, state_turn
    from gaca_agent.generate.prompts import format_response
    from gaca_envs.diag import exact_values
    from gaca_envs.diag.env import build_world

    mdp = build_world("pivots", 50, 3)
    asked = []

    def spy(policy, turns, answers):
        asked.extend(zip(turns, answers))
        return answer_logprobs(policy, turns, answers)

    monkeypatch.setattr(tabular, "answer_logprobs", spy)
    pi, mass = model_policy(policy, mdp, ENV)
    depth = first_steps(mdp)
    assert all(d >= 0 for d in depth)
    assert sorted(asked, key=str) == sorted(
        [(state_turn(mdp, s, ENV, depth[s]), format_response(a)) for s in range(mdp.num_states)
         for a in mdp.actions[s]], key=str)
    for s, p in enumerate(pi):
        assert p.shape == (len(mdp.actions[s]),) and p.sum() == pytest.approx(1.0)
        assert 0 < mass[s] <= 1
    s = next(i for i in range(mdp.num_states) if len(mdp.actions[i]) == 2 and depth[i] > 3)
    lps = answer_logprobs(policy, [state_turn(mdp, s, ENV, depth[s])] * 2,
                          [format_response(a) for a in mdp.actions[s]])
    assert pi[s][0] / pi[s][1] == pytest.approx(math.exp(lps[0] - lps[1]), rel=1e-6)
    assert np.isfinite(exact_values(mdp, pi, 0.95).Q[s]).all()
