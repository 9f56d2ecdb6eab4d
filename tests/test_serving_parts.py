"""gaca-serve's parts without a model: the request checks (every refusal names its
parameter), the response pieces, one streamed choice's deltas, and the batcher's
grouping, bounds and error delivery."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager

import pytest

from gaca_agent.serving import protocol as api
from gaca_agent.serving.protocol import APIError, ChatParams, parse_chat

MESSAGES = [{"role": "user", "content": "hi"}]


def body(**extra):
    return {"model": "tiny", "messages": MESSAGES, **extra}


def refused(value) -> APIError:
    with pytest.raises(APIError) as err:
        parse_chat(value)
    return err.value


def test_a_checked_request_holds_what_was_asked():
    assert parse_chat(body()) == ChatParams("tiny", ({"role": "user", "content": "hi"},))
    p = parse_chat(body(stream=True, stream_options={"include_usage": True}, n=3,
                        logprobs=True, top_logprobs=20, stop=["a", "", "b"], seed=-2 ** 63,
                        max_completion_tokens=7, max_tokens=7, temperature=0, top_p=0.5,
                        user="me", return_token_ids=True, return_tokens_as_token_ids=True,
                        return_weight_versions=True, frequency_penalty=0, top_k=-1,
                        min_p=0.0, repetition_penalty=1, logit_bias={}, store=False,
                        metadata={}, presence_penalty=0.0, tools=None))
    assert (p.stream, p.include_usage, p.n, p.logprobs, p.top_logprobs) == (True, True, 3,
                                                                          True, 20)
    assert (p.stop, p.seed, p.max_tokens, p.temperature, p.top_p) == (("a", "b"), -2 ** 63,
                                                                      7, 0.0, 0.5)
    assert p.return_token_ids and p.tokens_as_ids and p.weight_versions
    assert parse_chat(body(stop="x", max_tokens=3)).stop == ("x",)
    assert parse_chat(body(max_tokens=3)).max_tokens == 3
    assert parse_chat(body(stream=True)).include_usage is False
    roles = parse_chat(body(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "x", "name": "bot"},
        {"role": "system", "content": "s", "tool_calls": None}])).messages
    assert roles == ({"role": "system", "content": "a\nb"},
                     {"role": "assistant", "content": "x"}, {"role": "system", "content": "s"})


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": []}, "tools", "does not support the parameter 'tools'"),
    ({"frequency_penalty": 0.1}, "frequency_penalty", "supported: model, messages"),
    ({"top_k": -1, "tools": []}, "tools", "'tools'"),  # checked on after a neutral one
    ({"top_k": 5}, "top_k", "top_k"), ({"top_k": True}, "top_k", "top_k"),
    ({"repetition_penalty": 1.1}, "repetition_penalty", "repetition_penalty"),
    ({"repetition_penalty": True}, "repetition_penalty", "repetition_penalty"),
    ({"frequency_penalty": False}, "frequency_penalty", "frequency_penalty"),
    ({"model": ""}, "model", "'model' is required"), ({"model": 3}, "model", "required"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens", "not two different"),
    ({"max_tokens": 0}, "max_tokens", "at least 1, got 0"),
    ({"max_completion_tokens": 2.0}, "max_completion_tokens", "integer"),
    ({"logprobs": "yes"}, "logprobs", "true or false"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20, got 21"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "needs stream: true"),
    ({"stream": True, "stream_options": {"x": 1}}, "stream_options", "include_usage only"),
    ({"stream": True, "stream_options": [1]}, "stream_options", "include_usage only"),
    ({"temperature": 2.5}, "temperature", "between 0 and 2, got 2.5"),
    ({"temperature": "1"}, "temperature", "number"),
    ({"top_p": 0}, "top_p", "(0, 1]"), ({"top_p": 1.5}, "top_p", "between 0 and 1"),
    ({"seed": 2 ** 63}, "seed", "64-bit"), ({"seed": 1.0}, "seed", "64-bit"),
    ({"seed": True}, "seed", "64-bit"), ({"user": 3}, "user", "user must be a string"),
    ({"n": 17}, "n", "between 1 and 16"), ({"n": 0}, "n", "between 1 and 16"),
    ({"stop": ["a"] * 5}, "stop", "at most 4"), ({"stop": [1]}, "stop", "list of strings"),
    ({"stop": {"a": 1}}, "stop", "list of strings"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": ["hi"]}, "messages[0]", "must be an object"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "no tool calling"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "1"}]},
     "messages[0].tool_call_id", "is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "only text parts are supported, got 'image_url'"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content", "'str'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages[0].content", "only text parts"),
    ({"messages": [MESSAGES[0], {"role": "user", "content": 3}]}, "messages[1].content",
     "a string or a list of text parts"),
])
def test_every_refusal_names_its_parameter(extra, param, words):
    err = refused(body(**extra))
    assert (err.status, err.param) == (400, param) and words in err.message
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_error_bodies_and_response_pieces():
    assert refused([1]).message == "the request body must be a JSON object"
    assert refused(body(tools=[])).code == "unsupported_parameter"
    assert APIError(429, "busy").body()["error"]["type"] == "rate_limit_error"
    assert APIError(401, "key").body()["error"]["type"] == "authentication_error"
    assert APIError(503, "x").body()["error"]["type"] == "server_error"
    assert APIError(418, "x", "p", "c").body() == {"error": {"message": "x",
                                                             "type": "server_error",
                                                             "param": "p", "code": "c"}}
    entry = api.token_entry(("a", [97]), -0.5, [(("a", [97]), -0.5), (("b", [98]), -1.0)])
    assert entry == {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.5, "bytes": [97]},
        {"token": "b", "logprob": -1.0, "bytes": [98]}]}
    assert api.usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    chunk = api.chunk("id", 5, "m", [], include_usage=True, extra=1)
    assert chunk == {"id": "id", "object": "chat.completion.chunk", "created": 5,
                     "model": "m", "choices": [], "extra": 1, "usage": None}
    assert "usage" not in api.chunk("id", 5, "m", [])
    assert api.new_id().startswith("chatcmpl-") and api.new_id() != api.new_id()
    assert abs(api.now() - time.time()) < 2
    decoder = api.byte_decoder()
    assert sorted(decoder.values()) == list(range(256))  # every byte has one character
    assert decoder["A"] == 65 and decoder["\u0120"] == 32  # GPT-2's space


class CharTokenizer:
    """One character per token id (id = code point); id 0 is EOS; "§" is a special token
    (left out when asked to skip them)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if i and not (skip_special_tokens and i == 167))


def push_all(stream, text):
    return [stream.push(ord(c)) for c in text]


def test_a_streamed_choice_never_takes_back_a_delta():
    from gaca_agent.serving.stream import ChoiceStream, _settled

    s = ChoiceStream(CharTokenizer(), {0}, ["END"], 100)
    out = push_all(s, "abEN")
    assert [d for _, d in out] == ["a", "b", "", ""]  # "EN" may begin the stop string
    assert s.push(ord("X")) == (True, "ENX")  # it did not
    assert push_all(s, "yEND") == [(True, "y"), (True, ""), (True, ""), (True, "")]
    assert s.done and s.push(ord("z")) == (False, "")  # after the stop: not the choice's
    assert s.rest("abENXy") == ""
    eos = ChoiceStream(CharTokenizer(), {0}, [], 100)
    assert push_all(eos, "ok") == [(True, "o"), (True, "k")]
    assert eos.push(0) == (True, "") and eos.done
    short = ChoiceStream(CharTokenizer(), {0}, ["zz"], 2)
    assert push_all(short, "az") == [(True, "a"), (True, "z")]  # max tokens: all released
    assert short.done and short.rest("az!") == "!"
    with pytest.raises(RuntimeError, match="not a prefix"):
        short.rest("b")
    special = ChoiceStream(CharTokenizer(), {0}, [], 100)
    assert push_all(special, "a§") == [(True, "a"), (True, "§")]  # as the response has it
    assert _settled("abc\ufffd\ufffd", []) == "abc"
    assert _settled("xyab", ["abc", "bq"]) == "xy" and _settled("xya", ["bc"]) == "xya"
    assert _settled("", ["a"]) == ""


# ------------------------------------------------------------------ the batcher
class FakeEngine:
    """Echoes each request's prompt; records the batches; can be held or made to fail."""

    def __init__(self):
        self.batches, self.hold, self.fail = [], threading.Event(), None
        self.hold.set()

    def generate(self, requests, on_step=None):
        self.hold.wait(10)
        if self.fail is not None:
            raise self.fail
        self.batches.append([r.prompt_ids for r in requests])
        if on_step is not None:
            on_step(list(range(len(requests))), [7] * len(requests),
                    [-0.5] * len(requests), None)
        return [("out", r.prompt_ids) for r in requests]


class FakeAdapters:
    def __init__(self):
        self.used = []

    @contextmanager
    def use(self, name):
        self.used.append(name)
        yield


def job(model, *prompts, stream=False):
    from gaca_agent.generate.engines import Request
    from gaca_agent.serving.batcher import Job

    return Job(model, [Request((p,), 4) for p in prompts], stream)


def result(j, timeout=10):
    kind, *rest = j.events.get(timeout=timeout)
    while kind == "token":
        kind, *rest = j.events.get(timeout=timeout)
    return kind, *rest


def test_the_batcher_groups_by_model_bounds_rows_and_keeps_order():
    from gaca_agent.serving.batcher import Batcher, completion_usage

    engine, adapters = FakeEngine(), FakeAdapters()
    b = Batcher(engine, adapters, max_queue=8, max_rows=3)
    try:
        engine.hold.clear()
        first = job("base", 1)
        b.submit(first)
        time.sleep(0.2)  # the thread holds the first job in the engine
        jobs = [job("base", 2, 3), job("lora", 4), job("base", 5), job("base", 6, 7, 8)]
        for j in jobs:
            b.submit(j)
        engine.hold.set()
        # no token events
        assert first.events.get(timeout=10) == ("done", [("out", (1,))], "default")
        assert result(jobs[0]) == ("done", [("out", (2,)), ("out", (3,))], "default")
        assert result(jobs[1]) == ("done", [("out", (4,))], "default")
        assert result(jobs[3])[1] == [("out", (6,)), ("out", (7,)), ("out", (8,))]
        # 3 rows at most: [2, 3] with [4] (another model: its own call), then [5], then
        # [6, 7, 8], carried over whole
        assert engine.batches == [[(1,)], [(2,), (3,)], [(4,)], [(5,)], [(6,), (7,), (8,)]]
        assert adapters.used == ["base", "base", "lora", "base", "base"]
        assert (b.submitted, b.batches) == (5, 5)
        assert completion_usage([type("C", (), {"prompt_ids": [1, 2], "completion_ids": [3]}),
                                 type("C", (), {"prompt_ids": [1, 2],
                                                "completion_ids": [4, 5]})]) == (2, 3)
    finally:
        b.close()


def test_the_batcher_refuses_a_full_queue_skips_cancelled_jobs_and_reports_errors():
    from gaca_agent.serving.batcher import Batcher

    engine, adapters = FakeEngine(), FakeAdapters()
    b = Batcher(engine, adapters, max_queue=1, max_rows=8)
    try:
        engine.hold.clear()
        running = job("base", 1)
        b.submit(running)
        time.sleep(0.2)
        waiting = job("base", 2, stream=True)
        b.submit(waiting)
        with pytest.raises(APIError) as err:
            b.submit(job("base", 3))
        assert (err.value.status, err.value.code) == (429, "queue_full")
        assert "1 requests are waiting; retry later" in err.value.message
        engine.hold.set()
        assert waiting.events.get(timeout=10) == ("token", 0, 7, -0.5, None)  # streamed
        assert result(waiting) == ("done", [("out", (2,))], "default")
        cancelled = job("base", 4)
        cancelled.cancelled = True
        engine.hold.clear()
        b.submit(job("base", 9))
        time.sleep(0.2)
        b.submit(cancelled)
        engine.hold.set()
        time.sleep(0.3)
        assert [(4,)] not in engine.batches and cancelled.events.empty()
        engine.fail = ValueError("engine broke")
        broken = job("base", 5)
        b.submit(broken)
        kind, error = result(broken)
        assert kind == "error" and str(error) == "engine broke"
        engine.fail = None
        again = job("base", 6)
        b.submit(again)
        assert result(again)[0] == "done"  # the thread survived the error
    finally:
        b.close()
    deadline = time.time() + 5
    while b._thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(APIError) as err:
        b.submit(job("base", 1))
    assert err.value.status == 503 and "stopped" in err.value.message


def test_pausing_keeps_waits_for_or_aborts_the_work_as_asked():
    """keep holds queued work until resume; wait returns once the work taken is done and
    refuses new work; abort answers the queued jobs with 503 at once; any other mode is
    refused by name. No batch starts while paused."""
    from gaca_agent.serving.batcher import Batcher
    from gaca_agent.serving.weights import Weights

    engine, adapters = FakeEngine(), FakeAdapters()
    weights = Weights(engine, adapters)
    b = Batcher(engine, adapters, max_queue=8, max_rows=1, running=weights.running)
    try:
        with pytest.raises(APIError) as err:
            weights.pause("later", b)
        assert (err.value.status, err.value.param) == (400, "mode")
        assert not weights.paused and not weights.refusing
        weights.pause("keep", b)
        assert weights.paused and not weights.refusing  # new requests are held, not refused
        held = job("base", 1)
        b.submit(held)
        time.sleep(0.3)
        assert held.events.empty() and engine.batches == []
        weights.resume()
        assert result(held) == ("done", [("out", (1,))], "default") and not weights.paused
        engine.hold.clear()
        taken = job("base", 2)
        b.submit(taken)
        time.sleep(0.2)  # in the engine
        threading.Timer(0.5, engine.hold.set).start()
        t0 = time.monotonic()
        weights.pause("wait", b)
        assert time.monotonic() - t0 >= 0.3 and b.idle()  # returned when it was done
        assert result(taken)[0] == "done" and weights.refusing
        weights.resume()
        weights.pause("abort", b)
        queued = job("base", 3)
        b.submit(queued)
        weights.pause("abort", b)  # answers what is queued now
        kind, error = result(queued)
        assert kind == "error" and error.status == 503 and "paused" in error.message
        assert weights.refusing and engine.batches[-1] == [(2,)]
    finally:
        weights.resume()
        b.close()


def test_in_a_batch_only_streaming_jobs_get_token_events():
    from gaca_agent.serving.batcher import Batcher

    engine, adapters = FakeEngine(), FakeAdapters()
    b = Batcher(engine, adapters, max_queue=8, max_rows=8)
    try:
        engine.hold.clear()
        b.submit(job("base", 0))
        time.sleep(0.2)  # the engine holds the first; the next two share a batch
        plain, streamed = job("base", 1), job("base", 2, stream=True)
        b.submit(plain)
        b.submit(streamed)
        engine.hold.set()
        assert plain.events.get(timeout=10) == ("done", [("out", (1,))], "default")
        assert streamed.events.get(timeout=10)[0] == "token"
        assert engine.batches[-1] == [(1,), (2,)]
    finally:
        b.close()


def test_a_tokens_bytes_are_its_own_even_half_a_character():
    """Byte-level tokenizers: the bytes the token's pieces stand for (half of a UTF-8
    character stays half); a piece outside the byte alphabet, or another tokenizer: the
    UTF-8 of the token decoded with its special tokens."""
    class Tokenizer:
        pieces = {1: "Ġh", 2: "Ã", 3: "€x", 4: "<s>"}

        def convert_ids_to_tokens(self, i):
            return self.pieces[i]

        def decode(self, ids, skip_special_tokens=True):
            text = {1: " h", 2: "\ufffd", 3: "€x", 4: "<s>"}[ids[0]]
            return "" if skip_special_tokens and text == "<s>" else text

    tok, byte_level = Tokenizer(), api.byte_decoder()
    assert api.token_bytes(tok, 1, byte_level) == [32, 104]
    assert api.token_bytes(tok, 2, byte_level) == [0xC3]  # not the replacement character
    assert api.token_bytes(tok, 3, byte_level) == list("€x".encode())
    assert api.token_bytes(tok, 2, None) == list("\ufffd".encode())
    assert api.token_bytes(tok, 4, None) == list(b"<s>")


def test_gaca_serve_receives_a_broadcast_bit_equal_and_refuses_what_it_cannot(tiny_model_path):
    """gaca-serve's receiver in this process, the learner's end in another: per-tensor
    buckets land in the served weights bit for bit, a flattened bfloat16 bucket as the
    served dtype, each labelled; /weight_checker compares; a group that is missing, exists
    already or needs NCCL on a CPU server is refused with its parameter named."""
    import hashlib
    import subprocess
    import sys
    from pathlib import Path

    import torch

    from broadcast_probe import moved
    from gaca_agent.generate.http import ServerRefused, get_json, post_json
    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=4)
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_port}"

    def refused(path, body, param, words):
        with pytest.raises(ServerRefused, match=words) as err:
            post_json(root + path, body, retries=0)
        assert (err.value.status, err.value.param) == (400, param)

    try:
        here = Path(__file__).parent
        learner = subprocess.run([sys.executable, str(here / "broadcast_probe.py"), root,
                                  tiny_model_path, "5"], cwd=here.parent, capture_output=True,
                                 text=True, timeout=300)
        assert learner.returncode == 0, learner.stderr[-3000:]
        expected = dict(moved(tiny_model_path, 5))
        for name, _ in list(expected.items())[1:4]:  # sent (again) in bfloat16
            expected[name] = expected[name].bfloat16().float()
        digests = {k: hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy())
                   .hexdigest() for k, v in expected.items()}
        assert post_json(root + "/weight_checker", {"action": "checksum"},
                         retries=0)["checksums"] == digests
        assert post_json(root + "/weight_checker", {"action": "compare", "baseline": digests},
                         retries=0) == {"match": True, "mismatches": []}
        first = next(iter(digests))
        assert post_json(root + "/weight_checker",
                         {"action": "compare", "baseline": {**digests, first: "0"}},
                         retries=0) == {"match": False, "mismatches": [first]}
        assert get_json(root + "/get_weight_version", retries=0) == {"weight_version": "run-v2"}
        assert model.receiver.groups == {}  # the learner left its group
        refused("/weight_checker", {"action": "sum"}, "action", "checksum or compare")
        refused("/weight_checker", {"action": "compare"}, "baseline", "requires a 'baseline'")
        spec = {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "probe"}
        refused("/update_weights_from_distributed", spec, "group_name", "POST /init_weights")
        refused("/update_weights_from_distributed", {"names": ["w"]}, "names", "give names")
        group = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                 "world_size": 2, "group_name": "g"}
        refused("/init_weights_update_group", {**group, "backend": "nccl"}, "backend", "gloo")
        refused("/init_weights_update_group", group, "backend", "gloo")  # SGLang's default
        refused("/init_weights_update_group", {"master_address": "127.0.0.1"},
                "master_address", "give master_address, master_port")
        model.receiver.groups["g"] = "joined"
        refused("/init_weights_update_group", {**group, "backend": "gloo"}, "group_name",
                "'g' exists already")
        refused("/destroy_weights_update_group", {"group_name": "other"}, "group_name",
                "does not exist")
    finally:
        server.shutdown()
        server.server_close()
        model.close()


def test_admin_replies_are_in_the_servers_own_forms(tiny_model_path, tmp_path):
    """What SGLang's and vLLM's clients read back: /health, the version label, a disk
    update's success or failure body, collective_rpc's results, a full queue's Retry-After,
    pause_generation's default (abort); each refusal names its parameter."""
    import json
    import urllib.error
    import urllib.request

    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=4, max_batch=3)
    assert model.batcher.max_rows == 3 and model.engine.batch_size == 3
    assert model.batcher._thread.daemon  # a stopped server's process can exit
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_port}"

    def call(path, body=None, method="POST"):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(root + path, data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, json.loads(reply.read()), reply.headers
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), err.headers

    def refused(path, body, param):
        status, reply, _ = call(path, body)
        assert (status, reply["error"]["param"]) == (400, param), reply

    try:
        assert call("/health", method="GET")[:2] == (200, {"status": "ok"})
        assert call("/update_weight_version", {"new_version": "x1"})[:2] == \
            (200, {"success": True, "new_version": "x1"})
        refused("/update_weight_version", [1], "new_version")
        refused("/update_weights_from_disk", {}, "model_path")
        status, reply, _ = call("/update_weights_from_disk",
                                {"model_path": str(tmp_path / "none")})
        assert status == 400 and reply["success"] is False and reply["message"]
        assert reply["num_paused_requests"] == 0
        assert call("/update_weights_from_disk", {"model_path": tiny_model_path,
                                                  "weight_version": "disk-1"})[:2] == \
            (200, {"success": True, "message": "Succeeded to update model weights.",
                   "num_paused_requests": 0})
        assert call("/get_weight_version", method="GET")[1] == {"weight_version": "disk-1"}
        refused("/collective_rpc", {"method": "save"}, "method")
        refused("/collective_rpc", {"method": "reload_weights", "kwargs": {"path": "x"}},
                "kwargs")
        assert call("/collective_rpc", {"method": "reload_weights",
                                        "kwargs": {"weights_path": tiny_model_path}})[:2] == \
            (200, {"results": [None]})
        refused("/collective_rpc", {"method": "reload_weights",
                                    "kwargs": {"weights_path": str(tmp_path)}}, "weights_path")
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}
        assert call("/pause_generation", {})[0] == 200  # no mode: SGLang's abort
        assert call("/v1/chat/completions", chat)[0] == 503
        assert call("/continue_generation", {})[0] == 200
        assert call("/pause", None)[0] == 200  # vLLM's /pause without a mode: abort
        assert call("/v1/chat/completions", chat)[0] == 503
        assert call("/resume", None)[0] == 200
        model.context, context = 3, model.context
        status, reply, _ = call("/v1/chat/completions", chat)
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
        assert "this model's context is 3" in reply["error"]["message"]
        model.context = context
        full = queue.Queue(maxsize=1)  # a full queue: refused at once, saying when to retry
        full.put("waiting")
        model.batcher.queue = full
        status, reply, headers = call("/v1/chat/completions", chat)
        assert status == 429 and headers["Retry-After"] == "1"
        assert call("/update_weight_version", None)[0] == 400  # no body at all
        assert "Retry-After" not in call("/update_weight_version", [1])[2]
    finally:
        server.shutdown()
        server.server_close()
        model.close()


@pytest.mark.parametrize("n, stop", [(1, None), (2, ["e"]), (1, "held")])
def test_a_streamed_answer_is_the_plain_answer_in_pieces(tiny_model_path, n, stop):
    """Same seed, streamed or not: the deltas join into each choice's text, their log-prob
    entries (with top-k) and token ids into the plain answer's, the first chunk carries the
    prompt's ids, the last the finish reason; text that may begin a stop string is held
    back and sent at the end ("held": a stop string that begins with the answer's last
    character)."""
    import json
    import urllib.request

    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=12)
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go north"}],
            "max_tokens": 12, "n": n, "seed": 7, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True}

    def post(extra):
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_port}/v1/chat/completions",
            json.dumps({**body, **extra}).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.read().decode()

    try:
        if stop == "held":
            last = json.loads(post({}))["choices"][0]["message"]["content"][-1]
            stop = [last + "\u2603"]
        plain = json.loads(post({"stop": stop}))
        events = [line[6:] for line in post({"stream": True, "stop": stop}).splitlines()
                  if line.startswith("data: ")]
    finally:
        server.shutdown()
        server.server_close()
        model.close()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    for want in plain["choices"]:
        mine = [c for chunk in chunks for c in chunk["choices"] if c["index"] == want["index"]]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == \
            want["message"]["content"]
        assert [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]] == \
            want["logprobs"]["content"]
        assert all(c["logprobs"]["refusal"] is None for c in mine if c["logprobs"])
        assert [t for c in mine for t in c.get("token_ids", [])] == want["token_ids"]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == \
            [want["finish_reason"]]


@pytest.mark.parametrize("which", ["gaca-serve", "gaca-view"])
def test_a_client_that_hung_up_leaves_no_traceback_in_the_servers_log(which, tmp_path,
                                                                      capsys):
    """A trainer that timed out, or a closed browser tab, resets its connection mid-
    request: the server's log gets no traceback for it; any other error still prints
    one (socketserver's ``handle_error`` runs inside the handler's ``except``)."""
    if which == "gaca-serve":
        from gaca_agent.serving.app import ChatServer
        server = ChatServer(("127.0.0.1", 0), None, None)  # no request reaches a model
    else:
        from gaca_agent.view.app import make_server
        server = make_server(tmp_path)
    try:
        for error in (ConnectionResetError("reset by peer"), BrokenPipeError("pipe"),
                      ValueError("a real fault")):
            try:
                raise error
            except Exception:
                server.handle_error(None, ("127.0.0.1", 1))
        err = capsys.readouterr().err
    finally:
        server.server_close()
    assert "a real fault" in err and "Traceback" in err
    assert "reset by peer" not in err and "pipe" not in err
