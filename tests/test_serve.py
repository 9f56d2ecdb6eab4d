"""gaca-serve against the official ``openai`` client: a real server on 127.0.0.1 with the
tiny model; plain, streamed, n, log-probs (teacher-forced), stop, seed, refusals,
concurrency (batched, bounded queue), API key, LoRA adapters; the OpenAI policy."""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import has_module

pytestmark = pytest.mark.skipif(not (has_module("openai") and has_module("torch")),
                                reason="needs openai and torch (pip install -e '.[train,dev]')")

MESSAGES = [{"role": "user", "content": "Your task is to: find the key. You are in a hall."}]


class Served:
    def __init__(self, model, api_key=None):
        import openai

        from gaca_agent.serving.app import make_server

        self.model = model
        self.server = make_server(model, "127.0.0.1", 0, api_key)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.client = openai.OpenAI(base_url=self.base, api_key=api_key or "none",
                                    max_retries=0, timeout=120)

    def post(self, path, body):
        request = urllib.request.Request(self.base + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.model.close()


@pytest.fixture(scope="module")
def served(tiny_model_path):
    from gaca_agent.serving.app import ChatModel

    s = Served(ChatModel(tiny_model_path, "tiny", max_tokens=16))
    yield s
    s.close()


def chat(served, **kwargs):
    kwargs.setdefault("max_tokens", 12)
    return served.client.chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)


def wait_for(condition, timeout_s=60.0):
    from conftest import true_within

    assert true_within(condition, timeout_s, every=0.01), "timed out waiting"


def teacher_forced(model, prompt_ids, completion_ids, temperature):
    from conftest import full_logprobs

    return full_logprobs(model, prompt_ids, completion_ids, temperature).tolist()


def test_plain_request_with_exact_usage(served):
    [listed] = served.client.models.list().data
    assert (listed.id, listed.object, listed.owned_by) == ("tiny", "model", "gaca")
    assert listed.model_extra == {"root": "tiny", "parent": None} and listed.created > 0
    r = chat(served, seed=1, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert r.model == "tiny" and r.object == "chat.completion" and len(r.choices) == 1
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    prompt = served.model.prompt_ids(MESSAGES)
    extra = r.model_extra
    assert extra["prompt_token_ids"] == prompt
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == len(choice.model_extra["token_ids"]) <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert choice.logprobs is None  # not asked for


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_equal_a_teacher_forced_pass(served, temperature):
    r = chat(served, seed=5, temperature=temperature, logprobs=True, top_logprobs=3,
             extra_body={"return_token_ids": True})
    ids = r.choices[0].model_extra["token_ids"]
    content = r.choices[0].logprobs.content
    assert len(content) == len(ids) == r.usage.completion_tokens
    ref = teacher_forced(served.model.engine.model, r.model_extra["prompt_token_ids"], ids,
                         temperature)
    assert [e.logprob for e in content] == pytest.approx(ref, abs=1e-4)
    tokenizer = served.model.tokenizer
    for token_id, entry in zip(ids, content):
        assert entry.token == tokenizer.decode([token_id])
        assert len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert tops[0] >= entry.logprob - 1e-6
    if temperature == 0:  # greedy: the sampled token is the most likely one
        assert all(e.token == e.top_logprobs[0].token for e in content)
    # token ids instead of texts (vLLM's return_tokens_as_token_ids)
    again = chat(served, seed=5, temperature=temperature, logprobs=True,
                 extra_body={"return_tokens_as_token_ids": True})
    assert [e.token for e in again.choices[0].logprobs.content] == \
        [f"token_id:{t}" for t in ids]


def test_stream_adds_up_to_the_same_completion(served):
    plain = chat(served, seed=7, n=2, logprobs=True)
    stream = chat(served, seed=7, n=2, logprobs=True, stream=True,
                  stream_options={"include_usage": True})
    texts, lps, finish, usage, ids = ["", ""], [[], []], [None, None], None, set()
    for chunk in stream:
        ids.add(chunk.id)
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.logprobs and c.logprobs.content:
                lps[c.index] += [e.logprob for e in c.logprobs.content]
            if c.finish_reason:
                finish[c.index] = c.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
    assert len(ids) == 1
    assert texts == [c.message.content for c in plain.choices]
    assert finish == [c.finish_reason for c in plain.choices]
    assert lps == [[e.logprob for e in c.logprobs.content] for c in plain.choices]
    assert usage.completion_tokens == plain.usage.completion_tokens
    assert usage.prompt_tokens == plain.usage.prompt_tokens


def test_a_raw_stream_is_server_sent_events_with_the_role_first_and_token_ids(served):
    """What clients other than openai's read: the event-stream headers, a first chunk
    with each choice's role (and the prompt's ids), token ids and log-probs per chunk that
    add up to the plain response's, a finish reason per choice, then [DONE]."""
    ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "n": 2, "seed": 3,
           "logprobs": True, "return_token_ids": True, "stop": ["e"]}
    status, plain = served.post("/chat/completions", ask)
    assert status == 200
    plain = json.loads(plain)
    request = urllib.request.Request(served.base + "/chat/completions",
                                     json.dumps({**ask, "stream": True}).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    first = chunks[0]
    assert first["prompt_token_ids"] == plain["prompt_token_ids"]
    assert [c["delta"] for c in first["choices"]] == [{"role": "assistant", "content": ""}] * 2
    text, ids, lps, finish = ["", ""], [[], []], [[], []], [None, None]
    for chunk in chunks[1:]:
        assert chunk["model"] == "tiny" and "prompt_token_ids" not in chunk
        for c in chunk["choices"]:
            i = c["index"]
            text[i] += c["delta"].get("content", "")
            ids[i] += c.get("token_ids", [])
            lps[i] += [e["logprob"] for e in (c["logprobs"] or {"content": []})["content"]]
            if c["finish_reason"]:
                finish[i] = c["finish_reason"]
    for i, c in enumerate(plain["choices"]):
        assert text[i] == c["message"]["content"] and finish[i] == c["finish_reason"]
        assert ids[i] == c["token_ids"]
        assert lps[i] == [e["logprob"] for e in c["logprobs"]["content"]]


def test_a_request_fits_the_context_or_is_refused_by_name(served, monkeypatch):
    """max_tokens may fill the context exactly; unset, it is the server's cap or the room
    left; a prompt that leaves no room, or max_tokens past it, is a 400 naming which."""
    from gaca_agent.serving.protocol import APIError, parse_chat

    def ask(**extra):
        return served.model.requests(parse_chat({"model": "tiny", "messages": MESSAGES,
                                                 **extra}))

    n = len(served.model.prompt_ids(parse_chat({"model": "tiny",
                                                "messages": MESSAGES}).messages))
    assert [r.max_new_tokens for r in ask(n=2)] == [16, 16]  # the server's cap
    monkeypatch.setattr(served.model, "context", n + 3)
    assert ask()[0].max_new_tokens == 3 and ask(max_tokens=3)[0].max_new_tokens == 3
    assert ask()[0].prompt_ids == tuple(served.model.prompt_ids(
        parse_chat({"model": "tiny", "messages": MESSAGES}).messages))
    with pytest.raises(APIError) as err:
        ask(max_tokens=4)
    assert (err.value.status, err.value.param) == (400, "max_tokens")
    monkeypatch.setattr(served.model, "context", n + 1)
    assert ask()[0].max_new_tokens == 1  # one token of room is room
    monkeypatch.setattr(served.model, "context", n)
    with pytest.raises(APIError) as err:
        ask(max_tokens=1)
    assert (err.value.status, err.value.param, err.value.code) == \
        (400, "messages", "context_length_exceeded")


def test_a_plain_response_says_which_weights_answered(served):
    status, text = served.post("/chat/completions", {
        "model": "tiny", "messages": MESSAGES, "max_tokens": 5, "logprobs": True,
        "return_token_ids": True, "return_weight_versions": True, "seed": 4})
    reply = json.loads(text)
    [choice] = reply["choices"]
    assert status == 200 and reply["object"] == "chat.completion"
    assert isinstance(reply["created"], int) and reply["created"] > 0
    label = served.model.weights.version
    assert reply["metadata"] == {"weight_version": label}  # SGLang's form
    assert choice["weight_versions"] == [{"version": label, "start": 0,  # vLLM's form
                                          "end": len(choice["token_ids"])}]
    assert choice["logprobs"]["refusal"] is None
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


def test_n_and_seed(served):
    r = chat(served, n=2, seed=11, max_tokens=10)
    assert [c.index for c in r.choices] == [0, 1]
    texts = [c.message.content for c in r.choices]
    assert texts[0] != texts[1]  # two samples, not one copied
    assert [c.message.content for c in chat(served, n=2, seed=11, max_tokens=10).choices] == \
        texts  # same seed, same answers
    # the other choices depend on the seed too, not on their index alone
    other = [chat(served, n=2, seed=seed, max_tokens=10).choices[1].message.content
             for seed in (12, 13)]
    assert len({texts[1], *other}) == 3
    # a longer max_tokens continues the same sample (a request's draws are its own)
    longer = chat(served, n=2, seed=11, max_tokens=14).choices
    assert all(b.message.content.startswith(a.message.content) or a.finish_reason == "stop"
               for a, b in zip(r.choices, longer))


def test_stop_strings(served):
    full = chat(served, seed=3, max_tokens=16, temperature=0.7).choices[0].message.content
    cut = next(i for i in range(4, len(full)) if full[i].strip())
    stop = full[cut:cut + 2]
    at = full.find(stop)
    r = chat(served, seed=3, max_tokens=16, temperature=0.7, stop=[stop, "never-said"])
    assert r.choices[0].message.content == full[:at]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        served, seed=3, max_tokens=16, temperature=0.7, stop=stop, stream=True) if c.choices)
    assert streamed == full[:at]


def test_stream_holds_back_what_may_become_a_stop_string(tiny_model_path):
    """Stops end where a token-by-token generation first completes one ("yz" here, inside
    the longer stop that starts earlier); no delta is ever taken back."""
    from transformers import AutoTokenizer

    from gaca_agent.generate.engines import first_stop
    from gaca_agent.serving.stream import ChoiceStream

    assert first_stop("abc wxyzq", ["wxyzq", "yz"]) == (6, 8)
    assert first_stop("abc", ["x"]) is None
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    ids = tokenizer("abc wxyzq more", add_special_tokens=False)["input_ids"]
    stream = ChoiceStream(tokenizer, {tokenizer.eos_token_id}, ["wxyzq", "yz"], 100)
    deltas = [stream.push(t) for t in ids]
    text = "".join(d for _, d in deltas)
    assert text == "abc wx"
    assert stream.done and deltas[-1] == (False, "")  # " more" is not part of the choice


def test_unsupported_parameters_are_refused_by_name(served):
    import openai

    cases = [({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
             ({"response_format": {"type": "json_object"}}, "response_format"),
             ({"frequency_penalty": 0.5}, "frequency_penalty"),
             ({"extra_body": {"top_k": 5}}, "top_k"),
             ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
             ({"n": 99}, "n"), ({"temperature": 3.0}, "temperature")]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            chat(served, **kwargs)
        assert err.value.body["param"] == param, kwargs
        assert err.value.status_code == 400
    assert chat(served, frequency_penalty=0, seed=1).choices  # neutral values are fine
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(
            model="tiny", messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}])
    assert "role" in err.value.body["param"]
    with pytest.raises(openai.NotFoundError) as err:
        served.client.chat.completions.create(model="gpt-x", messages=MESSAGES)
    assert err.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as err:
        chat(served, max_tokens=10 ** 6)
    assert err.value.body["code"] == "context_length_exceeded"


def test_concurrent_requests_are_batched_and_unchanged_by_it(served):
    """8 requests sent together are all answered, in at most 2 engine batches (the
    first, then those that queued while it ran), each exactly as when it runs alone."""
    alone = [chat(served, seed=100 + i, max_tokens=4 + i).choices[0].message.content
             for i in range(8)]
    model = served.model
    before, accepted = model.batcher.batches, model.batcher.submitted
    with model.adapters.lock:  # hold the engine: requests queue up behind the first
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(chat, served, seed=100 + i, max_tokens=4 + i)
                       for i in range(8)]
            wait_for(lambda: model.batcher.submitted - accepted == 8)
            model.adapters.lock.release()  # let the batches run
            try:
                together = [f.result().choices[0].message.content for f in futures]
            finally:
                model.adapters.lock.acquire()
    assert together == alone
    assert 1 <= model.batcher.batches - before <= 2


def test_full_queue_is_refused_with_429(tiny_model_path):
    import openai

    from gaca_agent.serving.app import ChatModel

    s = Served(ChatModel(tiny_model_path, "tiny", max_queue=1))
    try:
        batcher = s.model.batcher
        with s.model.adapters.lock, ThreadPoolExecutor(3) as pool:
            running = pool.submit(chat, s)  # taken by the batcher, blocked on the engine
            wait_for(lambda: batcher.submitted == 1 and batcher.queue.qsize() == 0)
            waiting = pool.submit(chat, s)  # fills the queue of 1
            wait_for(lambda: batcher.queue.qsize() == 1)
            with pytest.raises(openai.RateLimitError) as err:
                chat(s)
            assert err.value.body["code"] == "queue_full"
            s.model.adapters.lock.release()
            try:
                assert running.result().choices and waiting.result().choices
            finally:
                s.model.adapters.lock.acquire()
    finally:
        s.close()


def test_api_key_and_bind_address(tiny_model_path):
    import openai

    from gaca_agent.serving.app import ChatModel, make_server

    s = Served(ChatModel(tiny_model_path, "tiny"), api_key="sekrit")
    try:
        assert chat(s, max_tokens=2).choices
        wrong = openai.OpenAI(base_url=s.base, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    finally:
        s.close()
    model = ChatModel(tiny_model_path, "tiny")
    try:
        with pytest.raises(ValueError, match="without an API key"):
            make_server(model, "0.0.0.0", 0)
    finally:
        model.close()


def test_lora_adapters_load_serve_and_unload(served, tmp_path):
    import openai
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from gaca_agent.serving.app import ChatModel

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(served.model.engine.model.name_or_path)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear",
                                           init_lora_weights=False))
    lora.save_pretrained(tmp_path / "v1")
    plain = chat(served, seed=2, logprobs=True, extra_body={"return_token_ids": True})
    code, text = served.post("/load_lora_adapter", {"lora_name": "v1",
                                                    "lora_path": str(tmp_path / "v1")})
    assert (code, text) == (200, "Success: LoRA adapter 'v1' added successfully.")
    try:
        models = {m.id: m.model_extra for m in served.client.models.list().data}
        assert models["v1"]["parent"] == "tiny" and models["v1"]["root"] == str(tmp_path / "v1")
        assert {m.object for m in served.client.models.list().data} == {"model"}
        r = served.client.chat.completions.create(
            model="v1", messages=MESSAGES, max_tokens=12, seed=2, logprobs=True,
            extra_body={"return_token_ids": True})
        assert r.model == "v1"
        ids = r.choices[0].model_extra["token_ids"]
        ref = teacher_forced(lora.eval(), r.model_extra["prompt_token_ids"], ids, 1.0)
        assert [e.logprob for e in r.choices[0].logprobs.content] == pytest.approx(ref,
                                                                                  abs=1e-4)
        # the base model is still served as itself
        again = chat(served, seed=2, logprobs=True)
        assert [e.logprob for e in again.choices[0].logprobs.content] == pytest.approx(
            [e.logprob for e in plain.choices[0].logprobs.content], abs=1e-5)
        assert served.post("/load_lora_adapter", {"lora_name": "v1",
                                                  "lora_path": str(tmp_path / "v1")})[0] == 400
        assert served.post("/load_lora_adapter", {"lora_name": "v2",
                                                  "lora_path": str(tmp_path)})[0] == 400
        from gaca_agent.serving.protocol import APIError

        # full weights (from disk, or broadcast) are refused while adapters are loaded
        with pytest.raises(APIError, match="while LoRA adapters are loaded"):
            served.model.weights.load([], "weights_path")
        with pytest.raises(APIError, match="while LoRA adapters are loaded"):
            with served.model.weights.replacing("names"):
                pass
        code, text = served.post("/load_lora_adapter", {"lora_name": "v3"})
        assert code == 400 and json.loads(text)["error"]["param"] == "lora_name"
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "adapter_config.json").write_text((tmp_path / "v1" /
                                                     "adapter_config.json").read_text())
        (broken / "adapter_model.safetensors").write_bytes(b"not a tensor file")
        code, text = served.post("/load_lora_adapter", {"lora_name": "v3",
                                                        "lora_path": str(broken)})
        assert code == 400 and json.loads(text)["error"]["param"] == "lora_path"
        assert "cannot load the adapter" in json.loads(text)["error"]["message"]
        # new weights under the same name, in place (SGLang's load_inplace), asked for in
        # SGLang's BASE:ADAPTER form
        torch.manual_seed(1)
        newer = get_peft_model(AutoModelForCausalLM.from_pretrained(
            served.model.engine.model.base_model.model.name_or_path),
            LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
        newer.save_pretrained(tmp_path / "v1b")
        assert served.post("/load_lora_adapter", {"lora_name": "v1", "load_inplace": True,
                                                  "lora_path": str(tmp_path / "v1b")})[0] == 200
        r = served.client.chat.completions.create(
            model="tiny:v1", messages=MESSAGES, max_tokens=12, seed=2, logprobs=True,
            extra_body={"return_token_ids": True})
        ref = teacher_forced(newer.eval(), r.model_extra["prompt_token_ids"],
                             r.choices[0].model_extra["token_ids"], 1.0)
        assert [e.logprob for e in r.choices[0].logprobs.content] == pytest.approx(ref,
                                                                                  abs=1e-4)
    finally:
        code, text = served.post("/unload_lora_adapter", {"lora_name": "v1"})
    assert (code, text) == (200, "Success: LoRA adapter 'v1' removed successfully.")
    assert served.post("/unload_lora_adapter", {"lora_name": "v1"})[0] == 404
    with pytest.raises(openai.NotFoundError):
        served.client.chat.completions.create(model="v1", messages=MESSAGES, max_tokens=2)
    assert not isinstance(served.model.engine.model, type(lora))  # back to the plain model
    del ChatModel


def test_openai_policy_records_the_servers_logprobs(served):
    from test_policies import turns

    from gaca_agent.policies import make_policy

    policy = make_policy(f"openai:{served.base}#tiny", max_new_tokens=12, concurrency=3,
                         token_ids=True)
    outs = policy.act(turns(3))
    assert len(outs) == 3
    for out in outs:
        assert out.logprobs and len(out.logprobs) == len(out.completion_ids)
        assert out.nll["response"] == pytest.approx(-sum(out.logprobs) / len(out.logprobs))
        assert set(out.nll) == {"response", "action", "think"}
        assert out.prompt_ids and out.extra["usage"]["completion_tokens"] == len(out.logprobs)


def test_openai_policy_falls_back_when_logprobs_are_refused(served):
    """A server without log-probs (here: one that refuses the parameter, as gaca-serve
    refuses what it lacks) is asked without them, once told."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from test_policies import turns

    from gaca_agent.policies import make_policy

    seen = []

    class NoLogprobs(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append("logprobs" in body)
            code, payload = (400, {"error": {"message": "no", "param": "logprobs"}}) \
                if "logprobs" in body else (200, {"choices": [{"message": {
                    "content": "<action>rest</action>"}}], "usage": {}})
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoLogprobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        policy = make_policy(f"openai:http://127.0.0.1:{server.server_port}/v1#m",
                             concurrency=1)
        outs = policy.act(turns(2))
        assert [o.action for o in outs] == ["rest", "rest"] and outs[0].logprobs is None
        assert seen == [True, False, False]  # refused once, then not asked again
    finally:
        server.shutdown()
        server.server_close()


def test_cli_refuses_an_open_address_without_a_key(tiny_model_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gaca_agent.cli.serve", tiny_model_path,
                          "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "without an API key" in out.stderr


def test_a_refused_body_never_becomes_the_next_request(served):
    """On a kept-alive connection, a request refused before its body was read (unknown
    route, oversized) closes the connection instead of parsing the body as a request."""
    import http.client

    port = served.server.server_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 3
    conn.request("POST", "/v1/nothing-here", body=body,
                 headers={"Content-Type": "application/json"})
    first = conn.getresponse()
    assert first.status == 404 and json.loads(first.read())["error"]["message"]
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}),
        headers={"Content-Type": "application/json"})
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["object"] == "chat.completion"
    conn.close()


def test_each_request_is_logged_with_its_id_tokens_and_time(served, caplog):
    """gaca-serve's INFO lines: a request taken, then answered (id, tokens, seconds)."""
    import logging

    caplog.set_level(logging.INFO, logger="gaca_agent.serving")
    r = chat(served, seed=5, max_tokens=6)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "gaca_agent.serving"]
    assert any(x.startswith("chat request from 127.0.0.1: model tiny, 1 choice(s), up to 6")
               for x in lines), lines
    done = [x for x in lines if x.startswith(f"chat {r.id}: ")]
    assert len(done) == 1 and (f"{r.usage.prompt_tokens} prompt + "
                               f"{r.usage.completion_tokens} completion tokens in ") in done[0]


def test_two_hundred_clients_connecting_at_once_are_all_answered(served):
    """The accept backlog holds a burst of connections (socketserver's default of 5 lost
    51 of these 200 to timeouts, and 5.6% of a 64-client soak's requests to resets)."""
    import socket

    port, n = served.server.server_port, 200
    barrier, failures = threading.Barrier(n), []

    def client():
        barrier.wait()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if not s.recv(100).startswith(b"HTTP/1.1 200"):
                    failures.append("not 200")
        except OSError as err:
            failures.append(repr(err))

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, (len(failures), failures[:3])


def test_weights_that_do_not_fit_are_refused_and_nothing_changes(served, tmp_path):
    """A full-weight load names the first tensor that does not fit (unknown or another
    shape) under the parameter it came in, and leaves every served weight as it was; a
    version label must be a non-empty string; a folder without safetensors is refused."""
    import torch

    from gaca_agent.serving.protocol import APIError

    weights = served.model.weights
    before = weights.checksums()
    name, tensor = next(iter(served.model.engine.model.state_dict().items()))
    for named in ([(name, torch.zeros_like(tensor)), ("lm_head.extra", torch.zeros(2))],
                  [(name, torch.zeros(tensor.numel() + 1))]):
        with pytest.raises(APIError) as err:
            weights.load(named, "names")
        bad = named[-1][0]
        assert (err.value.status, err.value.param) == (400, "names") and bad in err.value.message
        assert weights.checksums() == before
    with pytest.raises(APIError) as err:
        weights.reload(str(tmp_path))
    assert (err.value.status, err.value.param) == (400, "weights_path")
    for label in ("", 3, None):
        with pytest.raises(APIError) as err:
            weights.set_version(label)
        assert (err.value.status, err.value.param) == (400, "new_version")


def test_a_stream_whose_generation_fails_ends_with_the_error(served, monkeypatch):
    def boom(requests, on_step=None):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(served.model.engine, "generate", boom)
    request = urllib.request.Request(
        served.base + "/chat/completions",
        json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                    "stream": True}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as resp:
        events = [e for e in resp.read().decode().split("\n\n") if e]
    *_, last = [json.loads(e[len("data: "):]) for e in events]
    assert last["error"]["message"] == "generation failed: RuntimeError: the engine broke"
    assert last["error"]["type"] == "server_error"
