"""The server engine's contract with an inference server, against a scripted HTTP server:
every answer is checked for the weights it came from and the ids it carries, weight calls
go out once and in order, HTTP retries only where sending again is safe, the probe says
which flag to fix. No model is needed (the ids come from the scripted answers)."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from gaca_agent.generate.http import (ServerRefused, ServerTimedOut, ServerUnreachable,
                                      get_json, post_json)
from gaca_agent.generate.probe import ProbeMismatch, ProbeResult, check, probe
from gaca_agent.generate.server_engine import (MissingTokenIds, ServerEngine, StaleWeights,
                                               WeightSyncError)
from gaca_agent.generate.wire import reported_versions, sampling_fields, token_starts_from_bytes
from gaca_agent.generate.spans import span_nlls

MESSAGES = [{"role": "user", "content": "go"}]


class Scripted:
    """Answers each path from its script, a list of (status, body or seconds to stall;
    or "slow", (seconds, body)), the last entry repeated; records (path, body, headers)
    of every request."""

    def __init__(self, script: dict):
        self.script, self.calls = {k: list(v) for k, v in script.items()}, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, body):
                outer.calls.append((self.path, body, dict(self.headers)))
                path = self.path.split("?")[0]
                steps = outer.script.get(path) or [(404, {"error": {"message": "no route"}})]
                status, reply = steps.pop(0) if len(steps) > 1 else steps[0]
                if status == "stall":
                    time.sleep(reply)
                    status, reply = 200, {}
                elif status == "slow":  # (seconds, body): answered late
                    time.sleep(reply[0])
                    status, reply = 200, reply[1]
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                self.answer(json.loads(raw) if raw else None)

            def do_GET(self):
                self.answer(None)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.root = f"http://127.0.0.1:{self.server.server_port}"
        self.base = self.root + "/v1"

    def paths(self):
        return [p for p, _, _ in self.calls]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(script):
        made.append(Scripted(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


def chat(model="tiny", pieces=("<action>", "go", "</action>"), logprob=-0.5, ids=True,
         finish="stop", **extra):
    content = [{"token": t, "logprob": logprob, "bytes": list(t.encode())} for t in pieces]
    choice = {"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
              "logprobs": {"content": content}, "finish_reason": finish}
    reply = {"model": model, "choices": [choice]}
    if ids:
        choice["token_ids"] = list(range(5, 5 + len(pieces)))
        reply["prompt_token_ids"] = [1, 2, 3]
    for key, value in extra.items():
        (choice if key == "weight_versions" else reply)[key] = value
    return reply


def engine(server, kind="vllm", **kw):
    return ServerEngine(server.base, "tiny", None, kind=kind, retries=kw.pop("retries", 0),
                        backoff_s=0.01, **kw)


def test_every_sampling_parameter_is_stated_with_each_servers_neutral_value(scripted):
    s = scripted({"/v1/chat/completions": [(200, chat())]})
    for kind, top_k in (("vllm", 0), ("sglang", -1)):
        assert sampling_fields(kind, 0.7) == {
            "temperature": 0.7, "top_p": 1.0, "top_k": top_k, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    e = engine(s)
    e.complete(MESSAGES, 8, 0.7, key=42)
    body = s.calls[-1][1]
    assert (body["model"], body["max_tokens"], body["seed"], body["top_k"]) == ("tiny", 8, 42, 0)
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert "return_weight_versions" not in body  # nothing synced yet
    e.weight_version = "run-v1"
    s.script["/v1/chat/completions"] = [(200, chat(weight_versions=[["run-v1", 0, 3]]))]
    e.complete(MESSAGES, 8, 0.7)
    assert s.calls[-1][1]["return_weight_versions"] is True and "seed" not in s.calls[-1][1]


def test_answers_from_other_weights_stop_the_run(scripted):
    s = scripted({"/v1/chat/completions": [(200, chat())]})
    e = engine(s)
    e.weight_version = "run-v2"
    with pytest.raises(StaleWeights, match="reported no weight version"):
        e.complete(MESSAGES, 4, 1.0)  # after a sync, silence is not an answer
    spans = [{"version": "run-v1", "start": 0, "end": 1}, {"version": "run-v2", "start": 1,
                                                           "end": 3}]
    s.script["/v1/chat/completions"] = [(200, chat(weight_versions=spans))]
    with pytest.raises(StaleWeights, match=r"\['run-v1', 'run-v2'\].*run-v2"):
        e.complete(MESSAGES, 4, 1.0)  # a turn that spans an older version
    s.script["/v1/chat/completions"] = [(200, chat(weight_versions=[["run-v2", 0, 3]]))]
    assert e.complete(MESSAGES, 4, 1.0).model == "tiny"
    s.script["/v1/chat/completions"] = [(200, chat(model="other"))]
    with pytest.raises(StaleWeights, match="'tiny'.*'other'"):
        e.complete(MESSAGES, 4, 1.0)
    g = engine(s, kind="sglang")  # SGLang echoes the model: its own version label counts
    g.weight_version = "run-v2"
    for reported, ok in (("run-v2", True), ("run-v1", False), (None, False)):
        reply = chat(model="whatever", metadata={"weight_version": reported})
        s.script["/v1/chat/completions"] = [(200, reply)]
        if ok:
            assert g.complete(MESSAGES, 4, 1.0).token_source == "server"
        else:
            with pytest.raises(StaleWeights):
                g.complete(MESSAGES, 4, 1.0)
    assert reported_versions({"metadata": {"weight_version": 3}}, "sglang") == {"3"}
    assert reported_versions({"choices": [{}]}, "vllm") is None


def test_ids_and_log_probs_must_pair_and_finish_reasons_are_kept(scripted):
    bad = chat()
    bad["choices"][0]["token_ids"] = [5, 6, 7, 8]  # one id more than log-probs
    s = scripted({"/v1/chat/completions": [(200, bad)]})
    with pytest.raises(MissingTokenIds, match="4 token ids and 3 log-probs"):
        engine(s).complete(MESSAGES, 4, 1.0)
    s.script["/v1/chat/completions"] = [(200, chat(finish="length"))]
    c = engine(s).complete(MESSAGES, 4, 1.0)
    assert c.finish_reason == "length" and c.completion_ids == [5, 6, 7]
    assert c.prompt_ids == [1, 2, 3] and c.logprobs == [-0.5] * 3
    assert c.nll == {"response": 0.5, "action": 0.5, "think": 0.5}
    s.script["/v1/chat/completions"] = [(200, chat(finish="stop"))]
    assert engine(s).complete(MESSAGES, 4, 1.0).finish_reason == "stop"
    for missing, where in (("token_ids", "completion"), ("prompt_token_ids", "prompt")):
        reply = chat()
        (reply["choices"][0] if missing == "token_ids" else reply).pop(missing)
        s.script["/v1/chat/completions"] = [(200, reply)]
        with pytest.raises(MissingTokenIds, match=f"returned no {where} token ids for "):
            engine(s, require_ids=True).complete(MESSAGES, 4, 1.0)
    s.script["/v1/chat/completions"] = [(200, {"choices": []})]
    with pytest.raises(RuntimeError, match="without choices"):
        engine(s).complete(MESSAGES, 4, 1.0)


def test_a_submitted_turn_keeps_the_model_of_its_submission(scripted):
    s = scripted({"/v1/chat/completions": [("stall", 0.3), (200, chat(model="run-v1"))]})
    e = engine(s)
    e.adapter = "run-v1"
    future = e.submit(MESSAGES, 4, 1.0, key=1)
    e.adapter = "run-v2"  # a sync while the turn is in flight
    with pytest.raises(Exception):
        future.result(timeout=10)  # the stalled first answer has no choices
    future = e.submit(MESSAGES, 4, 1.0, key=2)
    assert s.calls[0][1]["model"] == "run-v1"
    with pytest.raises(StaleWeights):
        future.result(timeout=10)  # asked for run-v2, answered by run-v1
    e.close()


def test_adapters_swap_in_both_kinds_and_the_previous_is_unloaded(scripted):
    ok = [(200, {"success": True})]
    s = scripted({"/v1/load_lora_adapter": ok, "/v1/unload_lora_adapter": ok,
                  "/load_lora_adapter": ok, "/unload_lora_adapter": ok,
                  "/update_weight_version": ok})
    v = engine(s)
    v.load_adapter("a", "/x/a")
    v.load_adapter("b", "/x/b")
    v.load_adapter("b", "/x/b2")  # the same name again (load in place): nothing to unload
    assert s.paths() == ["/v1/load_lora_adapter", "/v1/load_lora_adapter",
                         "/v1/unload_lora_adapter", "/v1/load_lora_adapter"]
    assert s.calls[2][1] == {"lora_name": "a"}
    assert s.calls[0][1] == {"lora_name": "a", "lora_path": "/x/a"}
    assert (v.adapter, v.model, v.weight_version) == ("b", "b", None)
    s.calls.clear()
    g = engine(s, kind="sglang")
    g.load_adapter("a", "/x/a")
    assert s.paths() == ["/load_lora_adapter", "/update_weight_version"]
    assert s.calls[1][1] == {"new_version": "a", "abort_all_requests": False}
    assert (g.model, g.weight_version) == ("tiny:a", "a")
    s.script["/unload_lora_adapter"] = [(404, {"error": {"message": "gone"}})]
    g.unload_adapter("a")  # already gone: nothing to free


def test_weight_calls_go_out_once_and_say_what_failed(scripted):
    s = scripted({"/v1/load_lora_adapter": [(500, {"message": "rank 8 > max 4"})],
                  "/load_lora_adapter": [(200, {"success": False, "message": "no such dir"})]})
    v = engine(s, retries=3)
    with pytest.raises(WeightSyncError, match="rank 8 > max 4.*enable-lora"):
        v.load_adapter("a", "/x/a")
    assert s.paths() == ["/v1/load_lora_adapter"] and v.adapter is None  # sent once
    g = engine(s, kind="sglang", retries=3)
    with pytest.raises(WeightSyncError, match="no such dir"):
        g.load_adapter("a", "/x/a")
    assert g.adapter is None and g.weight_version is None


def test_full_weights_from_disk_in_both_kinds(scripted):
    ok = [(200, {"success": True})]
    s = scripted({"/pause": ok, "/collective_rpc": ok, "/update_weight_version": ok,
                  "/resume": ok, "/update_weights_from_disk": ok})
    v = engine(s)
    v.update_weights_from_disk("/w/v3", "run-v3")
    assert s.paths() == ["/pause?mode=wait", "/collective_rpc", "/update_weight_version",
                         "/resume"]
    assert s.calls[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": "/w/v3"}}
    assert s.calls[2][1] == {"new_version": "run-v3"} and v.weight_version == "run-v3"
    s.calls.clear()
    s.script["/collective_rpc"] = [(400, {"message": "shape mismatch"})]
    with pytest.raises(WeightSyncError, match="shape mismatch.*VLLM_SERVER_DEV_MODE"):
        v.update_weights_from_disk("/w/v4", "run-v4")
    assert s.paths()[-1] == "/resume"  # generation resumes after a failed load
    assert v.weight_version == "run-v3"
    s.calls.clear()
    g = engine(s, kind="sglang")
    g.update_weights_from_disk("/w/v5", "run-v5")
    assert s.paths() == ["/update_weights_from_disk"]
    assert s.calls[0][1] == {"model_path": "/w/v5", "weight_version": "run-v5",
                             "flush_cache": True}
    assert g.weight_version == "run-v5"  # the label it now reports
    s.script["/update_weights_from_disk"] = [(200, {"success": False, "message": "bad"})]
    with pytest.raises(WeightSyncError, match="bad.*SGLang must read"):
        g.update_weights_from_disk("/w/v6", "run-v6")
    assert g.weight_version == "run-v5"


def test_admin_calls_carry_the_admin_key_and_use_each_servers_paths(scripted):
    s = scripted({"/v1/load_lora_adapter": [(200, {})], "/update_weight_version": [(200, {})],
                  "/v1/chat/completions": [(200, chat(model="a"))]})
    e = ServerEngine(s.base + "/", "tiny", None, api_key="user", admin_api_key="admin",
                     retries=0)
    e.load_adapter("a", "/x/a")
    e.complete(MESSAGES, 4, 1.0)
    (_, _, load), (_, _, chat_headers) = s.calls[0], s.calls[1]
    assert load["Authorization"] == "Bearer admin" and chat_headers["Authorization"] == \
        "Bearer user"
    from gaca_agent.generate.http import get_json

    s.script["/is_paused"] = [(200, {"is_paused": False})]
    assert get_json(s.root + "/is_paused", "admin", retries=0) == {"is_paused": False}
    assert s.calls[-1][2]["Authorization"] == "Bearer admin"  # a GET carries its key too
    assert ServerEngine("http://h:1", "m", None)._admin_url("load_lora_adapter") == \
        "http://h:1/v1/load_lora_adapter"
    assert ServerEngine("http://h:1/v1", "m", None, kind="sglang")._admin_url(
        "load_lora_adapter") == "http://h:1/load_lora_adapter"
    with pytest.raises(ValueError, match="vllm or sglang"):
        ServerEngine("http://h:1", "m", None, kind="tgi")


def test_http_retries_only_where_sending_again_is_safe(scripted):
    s = scripted({"/busy": [(429, {}), (503, {}), (200, {"ok": 1})],
                  "/bad": [(400, {"error": {"message": "no", "param": "top_k"}})],
                  "/down": [(502, {"error": {"message": "still down", "param": "model"}})],
                  "/slow": [("stall", 1.5)], "/text": [(200, "plain")]})
    assert post_json(s.root + "/busy", {}, retries=3, backoff_s=0.01) == {"ok": 1}
    assert s.paths() == ["/busy"] * 3
    s.calls.clear()
    s.script["/busy"] = [(429, {}), (200, {"ok": 2})]
    with pytest.raises(ServerRefused) as refused:
        post_json(s.root + "/busy", {}, retries=3, backoff_s=0.01, retry_http=False)
    assert refused.value.status == 429 and s.paths() == ["/busy"]
    with pytest.raises(ServerRefused) as bad:
        post_json(s.root + "/bad", {}, retries=3, backoff_s=0.01)
    assert (bad.value.status, bad.value.param) == (400, "top_k")
    assert s.paths().count("/bad") == 1
    with pytest.raises(ServerRefused, match="still down.*after 3 tries") as down:
        post_json(s.root + "/down", {}, retries=2, backoff_s=0.01)
    assert s.paths().count("/down") == 3 and (down.value.status, down.value.param) == (502, "model")
    with pytest.raises(ServerTimedOut, match="not sent again"):
        post_json(s.root + "/slow", {}, timeout_s=0.3, retries=3, backoff_s=0.01)
    assert s.paths().count("/slow") == 1
    assert get_json(s.root + "/text", retries=0) == "plain"
    s.close()
    t0 = time.perf_counter()
    with pytest.raises(ServerUnreachable, match="after 3 tries"):
        get_json(s.root + "/text", retries=2, backoff_s=0.05)
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # exponential back-off between tries


def test_span_nlls_and_byte_offsets():
    content = [{"token": "<action>", "bytes": list(b"<action>")},
               {"token": "\u00e9", "bytes": [0xC3]}, {"token": "", "bytes": [0xA9]},
               {"token": "</action>"}]
    assert token_starts_from_bytes(content) == [0, 8, 8, 9]
    text = "<think>hm</think><action>go</action>"
    starts = [0, 7, 9, 17, 25, 27]
    lp = [-1.0, -2.0, -1.0, -1.0, -4.0, -1.0]
    nll = span_nlls(text, starts, lp)
    assert nll == pytest.approx({"response": 10 / 6, "think": 2.0, "action": 4.0})
    plain = span_nlls("no tags", [0, 3], [-1.0, -3.0])
    assert plain == {"response": 2.0, "action": 2.0, "think": 2.0}
    assert span_nlls("", [], []) == {"response": 0.0, "action": 0.0, "think": 0.0}


class Canned:
    """An engine whose two probe answers are given, as the probe sees them."""

    def __init__(self, first, again):
        self.answers, self.seen = [first, again], []

    def complete(self, messages, tokens, temperature, key=None):
        self.seen.append((tokens, temperature, key))
        from gaca_agent.generate.engines import Completion

        ids, lp = self.answers.pop(0)
        return Completion([1, 2], ids, lp, "x", "stop")


def test_probe_measures_the_gap_and_names_the_fix():
    import numpy as np

    learner = {0.5: np.array([-1.0, -2.0, -0.5]), 1.0: np.array([-1.1, -1.4, -0.5])}
    e = Canned(([7, 8, 9], [-1.1, -1.4, -0.5]), ([7, 8, 9], [0, 0, 0]))
    result = probe(e, lambda p, c, t: learner[t], 0.5, tokens=3)
    assert e.seen[0] == e.seen[1] and e.seen[0][:2] == (3, 0.5)
    assert result.mean_gap == pytest.approx(0.7 / 3) and result.max_gap == pytest.approx(0.6)
    assert result.raw_gap == pytest.approx(0.0) and result.seed_honoured
    assert result.metrics("p") == {"p/mean_gap": pytest.approx(0.7 / 3),
                                   "p/max_gap": pytest.approx(0.6), "p/tokens": 3.0,
                                   "p/seed_honoured": 1.0}
    other = probe(Canned(([7, 8, 9], [-1.0, -2.0, -0.5]), ([7, 8, 10], [0, 0, 0])),
                  lambda p, c, t: learner[1.0], 1.0, tokens=3)
    assert other.raw_gap is None and not other.seed_honoured
    with pytest.raises(ProbeMismatch, match="before the temperature.*processed_logprobs"):
        check(result, 0.1, "vllm")
    with pytest.raises(ProbeMismatch, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        check(result, 0.1, "sglang")
    check(result, result.mean_gap, "vllm")  # at the tolerance: passes
    half = ProbeResult(0.5, 0.5, 3, 1.0, 2.0, 0.5, True)  # temperature-1 gap not below half
    with pytest.raises(ProbeMismatch, match="generation-config vllm"):
        check(half, 0.1, "vllm")
    far = ProbeResult(0.5, 0.5, 3, 1.0, 2.0, 0.9, True)
    with pytest.raises(ProbeMismatch, match="generation-config vllm"):
        check(far, 0.1, "vllm")
    with pytest.raises(ProbeMismatch, match=re.escape(
            "--sampling-defaults openai (no sampling defaults from the model's "
            "generation_config.json) and check that the server serves the weights")):
        check(far, 0.1, "sglang")
    # the learner trains at another temperature than the server samples at: the rollout
    # probe scores at the learner's, so the gap shows and names the one temperature
    skewed = probe(Canned(([7, 8, 9], [-1.0, -2.0, -0.5]), ([7, 8, 9], [0, 0, 0])),
                   lambda p, c, t: learner[t], 0.5, tokens=3, learner_temperature=1.0)
    assert skewed.mean_gap == pytest.approx(0.7 / 3) and skewed.learner_temperature == 1.0
    with pytest.raises(ProbeMismatch, match="recomputes log-probs at temperature 1, not at "
                                            "the rollouts' 0.5: one temperature"):
        check(skewed, 0.1, "vllm")
    assert probe(Canned(([7, 8, 9], [-1.0, -2.0, -0.5]), ([7, 8, 9], [0, 0, 0])),
                 lambda p, c, t: learner[t], 0.5, tokens=3).mean_gap == 0.0


def test_the_sync_probe_scores_where_the_update_recomputes(tmp_path):
    """The weight sync's rollout probe asks the learner for the log-probs its update uses
    (learner.temperature), not for the rollouts' temperature: a learner left at 1 while
    the server samples at 0.5 stops the run naming both; at 0.5 the probe passes."""
    from types import SimpleNamespace

    pytest.importorskip("accelerate")
    from gaca_agent.config import ServerSection
    from gaca_agent.learner.config import LearnerConfig
    from gaca_agent.training.sync import WeightSync

    scores = {0.5: [-1.0, -2.0, -0.5], 1.0: [-1.1, -1.4, -0.5]}
    for trained_at, fails in ((1.0, True), (0.5, False)):
        engine = Canned(([7, 8, 9], scores[0.5]), ([7, 8, 9], [0, 0, 0]))
        engine.kind = "vllm"
        learner = SimpleNamespace(config=LearnerConfig(temperature=trained_at),
                                  accelerator=SimpleNamespace(num_processes=1),
                                  score=lambda p, c, t: np.asarray(scores[t]))
        servers = SimpleNamespace(members=[engine], lose=lambda e, err: False)
        sync = WeightSync(learner, servers, tmp_path, "run", ServerSection(probe_tokens=3),
                          0.5, 0.5)
        if fails:
            with pytest.raises(ProbeMismatch, match="at temperature 1, not at the "
                                                    "rollouts' 0.5"):
                sync._probe()
        else:
            assert sync._probe()["probe/mean_gap"] == 0.0


def test_the_server_section_makes_its_engine_with_keys_from_the_environment(monkeypatch):
    from gaca_agent.config import ServerSection
    from gaca_agent.generate.factory import make_engine

    monkeypatch.setenv("MY_KEY", "user-key")
    monkeypatch.setenv("MY_ADMIN_KEY", "admin-key")
    section = ServerSection(base_url="http://h:9/v1/", model="m", kind="sglang",
                            api_key_env="MY_KEY", admin_api_key_env="MY_ADMIN_KEY",
                            concurrency=3, timeout_s=7.0, retries=2)
    tokenizer = object()
    e = make_engine("server", tokenizer=tokenizer, server=section)
    try:
        assert (e.base_url, e.base_model, e.kind, e.tokenizer) == ("http://h:9/v1", "m",
                                                                  "sglang", tokenizer)
        assert (e.api_key, e.admin_api_key) == ("user-key", "admin-key")
        assert (e.timeout_s, e.retries, e.pool._max_workers) == (7.0, 2, 3)
    finally:
        e.close()
    with pytest.raises(ValueError, match="needs the server section"):
        make_engine("server")
    with pytest.raises(ValueError, match="unknown rollout engine 'tgi'"):
        make_engine("tgi")


def test_a_system_prompt_comes_first_as_the_system_message():
    from gaca_agent.generate.prompts import PromptBuilder
    from gaca_agent.types import Turn

    turn = Turn("gaca/Diag-Corridor-v0", "reach the exit", "You are in a hall.",
                ("walk forward",), (), 0)
    builder = PromptBuilder(0)
    with_system = builder.messages(turn, "Be brief.")
    assert with_system[0] == {"role": "system", "content": "Be brief."}
    assert with_system[1:] == builder.messages(turn) == [{"role": "user",
                                                           "content": builder.build(turn)}]


def test_a_completion_ends_at_its_eos_or_first_stop_string():
    """EOS: kept in the ids, not in the text, finish "stop"; a stop string: the text ends
    before it and the ids at the token completing it, finish "stop"; neither: "length".
    Log-probs are cut with the ids."""
    from gaca_agent.generate.engines import Request, finish

    class Chars:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids if i)

        def batch_decode(self, rows, skip_special_tokens=False):
            return [self.decode(r) for r in rows]

    ids = [ord(c) for c in "abXYcd"]
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    stopped = finish(Chars(), {0}, Request((1,), 8, stop=("XY",)), ids, lps, None)
    assert (stopped.text, stopped.finish_reason) == ("ab", "stop")
    assert stopped.completion_ids == ids[:4] and stopped.logprobs == lps[:4]
    at_start = finish(Chars(), {0}, Request((1,), 8, stop=("ab",)), ids, lps, None)
    assert (at_start.text, at_start.completion_ids) == ("", ids[:2])  # a stop at the start
    plain = finish(Chars(), {0}, Request((1,), 8, stop=("zz",)), ids, lps, None)
    assert (plain.text, plain.finish_reason, plain.completion_ids) == ("abXYcd", "length", ids)
    ended = finish(Chars(), {0}, Request((1,), 8), [97, 0, 98], [-1.0, -2.0, -3.0], [0.5] * 3)
    assert (ended.text, ended.finish_reason, ended.completion_ids) == ("a", "stop", [97, 0])
    assert ended.logprobs == [-1.0, -2.0] and ended.entropies == [0.5, 0.5]


def test_the_keyed_sampler_records_what_it_chose_and_its_top_and_entropy():
    """Greedy rows take the argmax; the scores handed back make greedy selection take the
    sampled token; log-probs, top-k pairs (plain softmax when greedy) and entropies are
    the distribution's; a top-p nucleus bounds what is drawn."""
    import torch

    from gaca_agent.generate.engines import KeyedSampler, nucleus

    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.5, 0.0]])
    plain = torch.log_softmax(scores, -1)
    greedy = KeyedSampler([1, 2], 0.0, with_entropy=True, top_k=2)
    out = greedy(None, scores)
    assert out[0].tolist() == [0.0, -math.inf, -math.inf, -math.inf]
    assert out[1].tolist() == [-math.inf, 0.0, -math.inf, -math.inf]
    assert np.allclose(greedy.logprobs(), [[plain[0, 0]], [plain[1, 1]]])
    top = greedy.top()
    assert [[i for i, _ in step] for step in (top[0][0], top[1][0])] == [[0, 1], [1, 2]]
    assert np.allclose([v for _, v in top[0][0]], plain[0, :2])
    p = plain.exp()
    assert np.allclose(greedy.entropies(), (-(p * plain).sum(-1)).unsqueeze(1))
    assert KeyedSampler([1], 1.0).entropies() is None and KeyedSampler([1], 1.0).top() is None
    assert KeyedSampler([7, 8], 1.0, with_entropy=True).entropies() == [[], []]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = nucleus(probs.log(), 0.7)
    assert np.allclose(kept[0, :2], probs.log()[0, :2]) and kept[0, 2:].tolist() == [-math.inf] * 2
    assert nucleus(probs.log(), 0.4)[0].isfinite().tolist() == [True, False, False, False]
    drawn = set()
    for key in range(60):  # keyed draws at T = 1 inside the 0.7 nucleus: tokens 0 and 1 only
        sampler = KeyedSampler([key], 1.0, top_p=0.7)
        drawn.add(int(sampler(None, probs.log()).argmax()))
    assert drawn == {0, 1}


def test_the_hf_engine_decodes_as_a_plain_greedy_loop(tiny_model_path):
    """Greedy rows of different lengths in one batch: the ids a token-by-token argmax over
    the model gives, each row cut at its own max_new_tokens (not the model's own
    generation settings)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.generate.engines import HFEngine, Request, eos_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.generation_config.do_sample, model.generation_config.max_new_tokens = True, 1
    prompts = [tuple(tokenizer("go north")["input_ids"]), tuple(tokenizer("a b c")["input_ids"])]
    out = HFEngine(model, tokenizer, device="cpu").generate(
        [Request(prompts[0], 6, 0.0), Request(prompts[1], 3, 0.0)])
    eos = eos_ids(model, tokenizer)
    for request, got in zip(((prompts[0], 6), (prompts[1], 3)), out):
        ids = list(request[0])
        for _ in range(request[1]):
            with torch.no_grad():
                token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token in eos:
                break
        assert got.completion_ids == ids[len(request[0]):]


def test_the_paged_engine_decodes_greedy_rows_as_the_hf_engine(tiny_model_path, monkeypatch):
    """transformers' continuous batching gives a greedy row the hf engine's ids (each at its
    own max_new_tokens), and samples from the full distribution at the request's
    temperature, whatever sampling defaults the model ships."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.generate.engines import HFEngine, PagedEngine, Request

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="paged|eager")
    requests = [Request(tuple(tokenizer("go north")["input_ids"]), 5, 0.0),
                Request(tuple(tokenizer("a b c")["input_ids"]), 3, 0.0)]
    paged = PagedEngine(model, tokenizer, device="cpu").generate(requests)
    hf = HFEngine(model, tokenizer, device="cpu").generate(requests)
    assert [c.completion_ids for c in paged] == [c.completion_ids for c in hf]
    assert [len(c.logprobs) for c in paged] == [len(c.completion_ids) for c in paged]
    with pytest.raises(ValueError, match="does not support top_p < 1"):
        PagedEngine(model, tokenizer).generate([Request((1, 2), 3, 1.0, top_p=0.9)])
    seen = []
    monkeypatch.setattr(model, "generate_batch", lambda ids, config, **kw: seen.append(config)
                        or {})
    model.generation_config.top_p, model.generation_config.top_k = 0.8, 20  # as Qwen2.5's
    PagedEngine(model, tokenizer, device="cpu")._batch([], 4, 0.7)
    assert (seen[0].do_sample, seen[0].temperature, seen[0].top_p, seen[0].top_k) == \
        (True, 0.7, 1.0, 0)


def test_a_server_admitted_in_a_lost_ones_place_serves_with_the_same_settings(scripted):
    """A lost server's replacement (its twin client, ServerGroup.admit) is up again: new
    episodes go to it, the old client is closed, the settings are the group's."""
    from gaca_agent.generate.server_group import ServerGroup

    slow = ("slow", (0.5, chat()))
    a = scripted({"/v1/chat/completions": [slow, (200, chat()), slow, (200, chat())]})
    b = scripted({"/v1/chat/completions": [(200, chat())]})
    c = scripted({"/v1/chat/completions": [(200, chat())]})
    lost = engine(b, api_key="k", timeout_s=7.0, keep_versions=2)
    group = ServerGroup([engine(a), lost])
    b.close()
    busy = group.submit(MESSAGES, 4, 1.0, key=0, episode="e0")  # a, busy
    group.complete(MESSAGES, 4, 1.0, key=1, episode="e1")  # b: gone, dropped; a answers
    busy.result(10)
    assert list(group.down) == [1] and len(a.calls) == 2
    twin = lost.twin(c.base)
    assert (twin.api_key, twin.timeout_s, twin.window.keep, twin.retries) == ("k", 7.0, 2, 0)
    assert twin.base_url == c.base.rstrip("/") and twin.weight_version is None
    group.admit(1, twin)
    assert not group.down and group.members == [group.engines[0], twin]
    assert lost.pool._shutdown  # the lost one's client is closed
    busy = group.submit(MESSAGES, 4, 1.0, key=2, episode="e2")  # a busy: the new one
    group.complete(MESSAGES, 4, 1.0, key=3, episode="e3")
    busy.result(10)
    assert len(c.calls) == 1 and c.calls[0][1]["seed"] == 3
    group.close()


def test_a_server_group_keeps_each_episode_on_one_server_and_survives_a_lost_one(scripted):
    """A new episode goes to the server with the fewest requests in flight, its later
    turns follow it; a server that stops answering is dropped and the turn is sent, with
    its seed, to another; with none left, one line names them all."""
    from gaca_agent.generate.server_group import ServerGroup, ServersDown

    a = scripted({"/v1/chat/completions": [("slow", (0.5, chat())), (200, chat())]})
    b = scripted({"/v1/chat/completions": [(200, chat())]})
    group = ServerGroup([engine(a), engine(b)])
    first = group.submit(MESSAGES, 4, 1.0, key=1, episode="e1")  # a tie: the first listed
    second = group.submit(MESSAGES, 4, 1.0, key=2, episode="e2")  # a is busy: b
    assert first.result(10).completion_ids == second.result(10).completion_ids == [5, 6, 7]
    assert (len(a.calls), len(b.calls)) == (1, 1)
    group.complete(MESSAGES, 4, 1.0, key=3, episode="e2")  # follows its episode to b
    group.complete(MESSAGES, 4, 1.0, key=4, episode="e3")  # none in flight: the first
    assert (len(a.calls), len(b.calls)) == (2, 2) and group.inflight == [0, 0]
    b.close()
    group.complete(MESSAGES, 4, 1.0, key=5, episode="e2")  # b is gone: a, same seed
    assert len(a.calls) == 3 and a.calls[-1][1]["seed"] == 5
    assert list(group.down) == [1] and group.members == [group.engines[0]]
    group.complete(MESSAGES, 4, 1.0, key=6, episode="e2")  # and stays there
    assert len(a.calls) == 4
    a.close()
    with pytest.raises(ServersDown, match="every inference server is down") as err:
        group.complete(MESSAGES, 4, 1.0, key=7, episode="e1")
    assert a.base in str(err.value) and b.base in str(err.value)
    group.close()
