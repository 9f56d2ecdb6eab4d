"""The ``server`` rollout engine: token ids as vLLM and SGLang return them, turns sampled
through gaca-serve exactly as the local engine samples them, no lock-step rounds, stale
weights and failed syncs stop the run, truncated importance sampling, the config's
refusals, and a LoRA training loop through a real gaca-serve process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import has_module

pytestmark = pytest.mark.skipif(not (has_module("torch") and has_module("peft")),
                                reason="needs torch and peft (pip install -e '.[train]')")


def test_token_ids_in_vllm_and_sglang_forms():
    from gaca_agent.generate.wire import returned_ids

    choice = {"message": {"content": "hi"}}
    vllm = {"prompt_token_ids": [1, 2], "choices": [{**choice, "token_ids": [7, 8]}]}
    sglang = {"choices": [{**choice, "prompt_token_ids": [1, 2],
                           "response_token_ids": [7, 8]}]}
    sglang_before_2026_08 = {"choices": [{**choice, "prompt_token_ids": [1, 2],
                                          "token_ids": [7, 8]}]}
    sglext = {"choices": [choice, choice], "sglext": {"input_ids": [1, 2],
                                                      "output_ids": [[5], [7, 8]]}}
    for reply, index in ((vllm, 0), (sglang, 0), (sglang_before_2026_08, 0), (sglext, 1)):
        ids = returned_ids(reply, index)
        assert (ids.prompt, ids.completion) == ([1, 2], [7, 8])
    none = returned_ids({"choices": [choice]})
    assert none.prompt is None and none.completion is None


class FakeServer:
    """A chat server written here for what gaca-serve never does: answer with another
    model's name, or without token ids (as an older vLLM or SGLang would)."""

    def __init__(self, model_answered: str, token_ids: bool, tokenizer=None):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(body)
                text = "<action>walk forward</action>"
                content = [{"token": t, "logprob": -0.5, "bytes": list(t.encode())}
                           for t in ("<action>", "walk forward", "</action>")]
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "logprobs": {"content": content}, "finish_reason": "stop"}
                reply = {"model": model_answered, "choices": [choice]}
                if token_ids:
                    choice["token_ids"] = [5, 6, 7]
                    reply["prompt_token_ids"] = [1, 2, 3]
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_stale_weights_stop_and_missing_ids_stop_training(tiny_model_path):
    from transformers import AutoTokenizer

    from gaca_agent.generate.server_engine import MissingTokenIds, ServerEngine, StaleWeights

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [{"role": "user", "content": "go"}]
    stale = FakeServer("run-v1", token_ids=True)
    try:
        engine = ServerEngine(stale.base, "tiny", tok, retries=0)
        engine.adapter = "run-v2"
        with pytest.raises(StaleWeights, match="run-v2.*run-v1"):
            engine.complete(messages, 8, 1.0, key=3)
        assert stale.seen[0]["model"] == "run-v2" and stale.seen[0]["seed"] == 3
        assert stale.seen[0]["logprobs"] and stale.seen[0]["return_token_ids"]
    finally:
        stale.close()
    bare = FakeServer("tiny", token_ids=False)
    try:
        with pytest.raises(MissingTokenIds, match="re-tokenizing"):
            ServerEngine(bare.base, "tiny", tok, retries=0).complete(messages, 8, 1.0)
        c = ServerEngine(bare.base, "tiny", tok, retries=0,
                         require_ids=False).complete(messages, 8, 1.0)
        assert c.token_source == "retokenized"
        expected = tok(c.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert c.completion_ids == expected
        chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert c.prompt_ids == tok(chat, add_special_tokens=False)["input_ids"]
        assert len(c.logprobs) == len(c.completion_ids)
        assert c.nll["response"] == pytest.approx(0.5)
        from gaca_agent.policies.hf import to_output

        assert to_output(c).extra["token_source"] == "retokenized"
    finally:
        bare.close()
    exact = FakeServer("tiny", token_ids=True)
    try:
        c = ServerEngine(exact.base, "tiny", tok, retries=0).complete(messages, 8, 1.0)
        assert (c.token_source, c.prompt_ids, c.completion_ids) == ("server", [1, 2, 3],
                                                                    [5, 6, 7])
    finally:
        exact.close()


@pytest.fixture(scope="module")
def served(tiny_model_path):
    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny")
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1", model
    server.shutdown()
    server.server_close()
    model.close()


def turns(n):
    from gaca_agent.generate.sampling import row_key
    from gaca_agent.types import Turn

    return [Turn("gaca/Diag-Corridor-v0", "Reach the exit.", f"Corridor, segment {i + 1}.",
                 ("rest", "walk forward"), (), 0, key=row_key(7, i)) for i in range(n)]


def test_server_turns_equal_the_local_engines(served, tiny_model_path):
    """The same turns (keys) through gaca-serve and through the hf engine: the same
    tokens, log-probs and span NLLs."""
    from gaca_agent.policies.hf import HFPolicy
    from gaca_agent.policies.served import ServerPolicy
    from gaca_agent.generate.server_engine import ServerEngine

    base, model = served
    local = HFPolicy(tiny_model_path, temperature=1.0, max_new_tokens=12)
    remote = ServerPolicy(ServerEngine(base, "tiny", local.tokenizer), 1.0, 12)
    a, b = local.act(turns(4)), remote.act(turns(4))
    for x, y in zip(a, b):
        assert (x.text, x.prompt_ids, x.completion_ids) == (y.text, y.prompt_ids,
                                                            y.completion_ids)
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        assert x.nll == pytest.approx(y.nll, abs=1e-4)
        assert y.extra == {"token_source": "server", "model": "tiny"}  # exact ids


def test_adapter_sync_in_both_kinds_and_a_failed_load(served, tiny_model_path, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.generate.server_engine import ServerEngine, WeightSyncError

    base, model = served
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    for version in (1, 2):
        torch.manual_seed(version)
        lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path),
                              LoraConfig(r=4, target_modules="all-linear",
                                         init_lora_weights=False))
        lora.save_pretrained(tmp_path / f"v{version}")
    messages = [{"role": "user", "content": "Reach the exit."}]
    for kind in ("vllm", "sglang"):
        engine = ServerEngine(base, "tiny", tok, kind=kind, retries=0)
        engine.load_adapter(f"{kind}-v1", str(tmp_path / "v1"))
        first = engine.complete(messages, 6, 1.0, key=1)
        assert first.model == ("vllm-v1" if kind == "vllm" else "tiny:sglang-v1")
        engine.load_adapter(f"{kind}-v2", str(tmp_path / "v2"))
        second = engine.complete(messages, 6, 1.0, key=1)
        assert second.model == engine.model and f"{kind}-v2" in second.model
        assert list(model.adapters.paths) == [f"{kind}-v2"]  # v1 was unloaded
        assert first.logprobs != second.logprobs  # other weights
        engine.unload_adapter(f"{kind}-v2")
    engine = ServerEngine(base, "tiny", tok, retries=0)
    with pytest.raises(WeightSyncError, match="enable-lora"):
        engine.load_adapter("broken", str(tmp_path / "missing"))
    assert engine.adapter is None  # still on the weights it had


def test_streaming_policies_are_not_played_in_rounds():
    """A slow answer for one episode does not hold the others: while its first turn is in
    flight, the fast episodes play on."""
    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection
    from gaca_agent.types import ActionOutput

    timeline = []

    class Uneven:  # answers episode 0's first turn after 0.6 s, every other in 0.01 s
        needs_expert = False

        def submit(self, turn):
            slow = turn.key == slow_key
            future: Future = Future()

            def answer():
                timeline.append((time.perf_counter(), slow))
                future.set_result(ActionOutput("<action>walk forward</action>",
                                               "walk forward"))

            threading.Timer(0.6 if slow else 0.01, answer).start()
            return future

    from gaca_agent.generate.sampling import row_key

    slow_key = row_key(11, 0, 0)  # episode 0 (seed 11, member 0), step 0
    collector = Collector(EnvSection(id="gaca/Diag-Corridor-v0", kwargs={"split": "test"},
                                     max_live_envs=3, invalid_penalty=0.0))
    try:
        rollout = collector.run(Uneven(), [(0, 11), (1, 12), (2, 13)], group_size=1)
    finally:
        collector.close()
    assert all(ep.length > 1 for ep in rollout.episodes)
    slow_first = min(t for t, slow in timeline if slow)
    fast_before = sum(1 for t, slow in timeline if not slow and t < slow_first)
    assert fast_before >= 10  # rounds would have allowed 2 (each fast episode's first turn)


def test_config_refuses_what_the_server_engine_cannot_do():
    from gaca_agent.config import load_config

    server = ["model.engine=server", "server.base_url=http://127.0.0.1:1/v1",
              "server.model=tiny", "learner.old_logprobs=recompute"]
    full = load_config(None, server)  # full fine-tuning: weights synced from disk
    assert full.learner.lora_r == 0 and full.server.sync_dtype == "float32"
    with pytest.raises(ValueError, match="probe_tolerance > 0"):
        load_config(None, server + ["server.probe_tolerance=0"])
    with pytest.raises(ValueError, match="old_logprobs: recompute"):
        load_config(None, server[:3] + ["learner.lora_r=4"])
    with pytest.raises(ValueError, match="server.base_url"):
        load_config(None, ["model.engine=server", "learner.lora_r=4"])
    with pytest.raises(ValueError, match="tis_cap needs old_logprobs: recompute"):
        load_config(None, ["learner.tis_cap=2"])
    cfg = load_config(None, server + ["learner.lora_r=4", "learner.tis_cap=2"])
    assert cfg.model.engine == "server" and cfg.learner.tis_cap == 2.0


LOOP = """
import json, sys
from gaca_agent.config import load_config
from gaca_agent.training.loop import train

if __name__ == "__main__":
    run = train(load_config("gaca_agent/configs/default.yaml", sys.argv[1:]), progress=False)
    print("RUN", run)
"""


def start_gaca_serve(path: str, root, port: int = 0):
    serve = subprocess.Popen([sys.executable, "-m", "gaca_agent.cli.serve", path, "--name", "tiny",
                              "--port", str(port)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=root)
    line = serve.stdout.readline()
    while "server on" not in line:
        assert line, "gaca-serve exited"
        line = serve.stdout.readline()
    # keep reading its request log: a full pipe would block the server's next log line
    threading.Thread(target=serve.stdout.read, daemon=True).start()
    return serve, re.search(r"(http://\S+/v1)", line).group(1)


def train_both_engines(tmp_path, base, weights: list[str]):
    """Three iterations with engine hf and with engine server (gaca-serve at ``base``):
    their run folders, after checking that they sampled and trained alike."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    common = ["iterations=3", "eval_every=0", "checkpoint_every=0", "env.groups=2",
              "env.group_size=4", "env.invalid_penalty=-0.1", "learner.lr=0.01",
              "learner.kl_coef=0.0", "learner.old_logprobs=recompute", "warmup.bc_steps=10",
              "keep_rollouts=true", f"out_dir={tmp_path}", *weights]
    metrics, runs = {}, {}
    for engine in ("hf", "server"):
        extra = [f"server.base_url={base}", "server.model=tiny"] if engine == "server" \
            else []
        out = subprocess.run([sys.executable, str(script), *common, f"name={engine}",
                              f"model.engine={engine}", *extra], cwd=root,
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[engine] = Path(out.stdout.split("RUN ")[-1].strip())
        metrics[engine] = [json.loads(x) for x in
                           (runs[engine] / "metrics.jsonl").read_text().splitlines()]
    rows = [(a, b) for a, b in zip(metrics["hf"], metrics["server"]) if a["iteration"] >= 0]
    assert len(rows) == 3
    same = same_samples(runs["hf"], runs["server"])
    for it, (a, b) in enumerate(rows):
        if same[it]:  # this and every earlier iteration sampled the same episodes
            # the same samples from the same weights: the same iteration, to rounding
            for key in ("rollout/return", "rollout/success", "rollout/length",
                        "rollout/format_invalid", "train/tokens"):
                assert a[key] == pytest.approx(b[key], rel=1e-6), (it, key)
            for key in ("losses/policy", "losses/grad_norm"):
                assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-6), (it, key)
        assert b["sync/version"] == it + 1
        assert b["train/rollout_logprob_gap"] < 1e-4  # same kernels: ratio 1
        assert b["train/is_ratio_max"] == pytest.approx(1.0, abs=1e-3)
        # the probe after each sync: the server serves the learner's new weights
        assert b["probe/mean_gap"] < 1e-4 and b["probe_eval/mean_gap"] < 1e-4
        assert b["probe/seed_honoured"] == 1.0
    return runs


def same_samples(hf, server) -> list[bool]:
    """Whether each iteration's episodes, and every earlier one's, are the same in both
    runs (rollouts/), after checking that the runs sampled alike: in the first iteration
    (the same warmed-up weights) at most 2 of the 8 episodes differ, and until an
    iteration differs, every step before its episode's first different one has the same
    NLL in both runs.

    The engines' logits agree to about 1e-6, not bitwise (gaca-serve batches whatever
    requests are waiting, so a row's padded batch depends on timing), so now and then a
    token whose draw falls that close to a boundary of the inverse CDF is sampled as its
    neighbour (three of the last full test runs saw it), and the rest of that episode
    follows from it. After an update the weights agree to rounding, not bitwise, and
    such flips come more often (one run here had 4 in its second iteration); from an
    update on flipped samples, the runs are two different runs (Adam magnifies the one
    step's gradient: a flip forced in iteration 1 made 308 of iteration 2's 320 steps
    differ).
    A server that sampled from another distribution (another temperature, seed or
    weights) differs in every episode of the first iteration."""
    import gzip

    same = []
    for it in range(3):
        if same and not same[-1]:
            return same + [False] * (3 - it)
        name = f"rollouts/iter-{it:05d}.rank0.jsonl.gz"
        a, b = ([json.loads(x) for x in gzip.open(run / name, "rt")] for run in (hf, server))
        assert len(a) == len(b) == 8
        differ = 0
        for x, y in zip(a, b):
            differ += [s["response"] for s in x["trajectory"]] != \
                [t["response"] for t in y["trajectory"]]
            for s, t in zip(x["trajectory"], y["trajectory"]):
                if s["response"] != t["response"]:
                    break  # the rest of this episode follows from another token
                assert s["nll"] == pytest.approx(t["nll"], abs=1e-4), (it, s["t"])
        assert it > 0 or differ <= 2, f"{differ} of 8 episodes were sampled differently"
        same.append(differ == 0)
    return same


@pytest.mark.slow
def test_lora_training_through_gaca_serve_matches_the_local_engine(tmp_path):
    """Three LoRA iterations with engine server (a gaca-serve process) and with engine
    hf: the same rollouts and losses; the server ends up serving the last adapter."""
    from pathlib import Path

    from gaca_agent.policies.tiny_model import cached_tiny_model

    root = Path(__file__).resolve().parents[1]
    serve, base = start_gaca_serve(str(cached_tiny_model(0)), root)
    try:
        runs = train_both_engines(tmp_path, base, ["learner.lora_r=4"])
        # the server serves the last version (and only it): the final adapter's weights
        with urllib_json(base + "/models") as listing:
            adapters = [m for m in listing["data"] if m.get("parent") == "tiny"]
        assert len(adapters) == 1 and adapters[0]["id"].endswith("-v3")
        assert adapters[0]["root"] == str((runs["server"] / "adapters" / "v3").resolve())
        final = runs["server"] / "final" / "model" / "adapter_model.safetensors"
        served = Path(adapters[0]["root"]) / "adapter_model.safetensors"
        assert final.read_bytes() == served.read_bytes()
    finally:
        serve.terminate()
        serve.wait(timeout=30)


@pytest.mark.slow
def test_full_finetuning_through_gaca_serve_matches_the_local_engine(tmp_path):
    """Three full-fine-tuning iterations with engine server (weights synced from disk
    into a gaca-serve process) and with engine hf: the same rollouts and losses; the
    server ends up serving the learner's final weights."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from gaca_agent.policies.tiny_model import cached_tiny_model

    root = Path(__file__).resolve().parents[1]
    serve, base = start_gaca_serve(str(cached_tiny_model(0)), root)
    try:
        runs = train_both_engines(tmp_path, base, [])
        run = runs["server"]
        with urllib_json(base.removesuffix("/v1") + "/weight_info") as info:
            assert info["weight_version"].endswith("-v3")
        final = load_file(str(run / "final" / "model" / "model.safetensors"))
        synced = load_file(str(run / "weights" / "v3" / "model.safetensors"))
        assert set(final) == set(synced)
        assert all(torch.equal(final[k], synced[k]) for k in final)
        first = load_file(str(cached_tiny_model(0) / "model.safetensors"))
        assert any(not torch.equal(first[k], final[k]) for k in final)  # it did train
        assert sorted(p.name for p in (run / "weights").iterdir()) == ["v2", "v3"]
    finally:
        serve.terminate()
        serve.wait(timeout=30)


class urllib_json:
    def __init__(self, url):
        import urllib.request

        self.resp = urllib.request.urlopen(url)

    def __enter__(self):
        return json.loads(self.resp.read())

    def __exit__(self, *exc):
        self.resp.close()


def test_gaca_serve_full_weight_updates_in_both_forms(served, tiny_model_path, tmp_path):
    """gaca-serve's disk updates: vLLM's (pause, reload_weights, version, resume) and
    SGLang's (update_weights_from_disk); the label comes back in every response; a folder
    without weights is refused with the reason and the served label is unchanged; a
    paused server answers chat requests with 503."""
    from transformers import AutoTokenizer

    from gaca_agent.generate.server_engine import (ServerEngine, ServerRefused, WeightSyncError,
                                           post_json)

    base, model = served
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [{"role": "user", "content": "Reach the exit."}]
    before = ServerEngine(base, "tiny", tok, retries=0).complete(messages, 6, 1.0, key=4)
    for kind in ("vllm", "sglang"):
        engine = ServerEngine(base, "tiny", tok, kind=kind, retries=0)
        engine.update_weights_from_disk(tiny_model_path, f"{kind}-v1")  # the same weights
        after = engine.complete(messages, 6, 1.0, key=4)
        assert after.completion_ids == before.completion_ids
        assert model.weights.version == f"{kind}-v1" and not model.weights.paused
        with pytest.raises(WeightSyncError, match="no safetensors"):
            engine.update_weights_from_disk(str(tmp_path), f"{kind}-v2")
        assert model.weights.version == f"{kind}-v1" and not model.weights.paused
    root = base.removesuffix("/v1")
    post_json(root + "/pause?mode=wait", None, retries=0)
    try:
        with pytest.raises(ServerRefused, match="503.*paused"):
            post_json(base + "/chat/completions", {"model": "tiny", "messages": messages},
                      retries=0, retry_http=False)
    finally:
        post_json(root + "/resume", None, retries=0)


@pytest.mark.slow
def test_training_stops_in_one_line_when_gaca_serve_dies_and_resumes(tmp_path):
    """gaca-serve (engine: server, LoRA) is killed during iteration 2: the run stops with
    one line naming the server and the intact checkpoint; with a fresh gaca-serve on the
    same port, --resume pushes the checkpoint's adapter and finishes with the rollouts of
    an undisturbed run (engine hf)."""
    from pathlib import Path

    from conftest import free_port, stop_at_first_checkpoint
    from gaca_agent.policies.tiny_model import cached_tiny_model

    root = Path(__file__).resolve().parents[1]
    common = ["--no-progress", "--config", "default", "iterations=3", "eval_every=0",
              "checkpoint_every=1", "env.groups=2", "env.group_size=4",
              "env.invalid_penalty=-0.1", "learner.lr=0.01", "learner.kl_coef=0.0",
              "learner.old_logprobs=recompute", "warmup.bc_steps=10", "learner.lora_r=4",
              f"out_dir={tmp_path}"]
    train = [sys.executable, "-m", "gaca_agent.cli.train"]
    hf = subprocess.run([*train, *common, "name=hf"], cwd=root, capture_output=True,
                        text=True, timeout=900)
    assert hf.returncode == 0, hf.stderr[-3000:]
    port = free_port()
    serve, base = start_gaca_serve(str(cached_tiny_model(0)), root, port)
    server_args = ["model.engine=server", f"server.base_url={base}", "server.model=tiny",
                   "server.retries=1", "name=server"]
    run = subprocess.Popen([*train, *common, *server_args], cwd=root,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stopped, error = stop_at_first_checkpoint(run, tmp_path / "server", serve, 3)
    assert f"127.0.0.1:{port}" in error, error
    serve, _ = start_gaca_serve(str(cached_tiny_model(0)), root, port)
    try:
        resumed = subprocess.run([*train, "--no-progress", "--resume", str(tmp_path / "server")],
                                 cwd=root, capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    rows = {name: {r["iteration"]: r for r in map(json.loads, (tmp_path / name /
                                                               "metrics.jsonl").read_text()
                                                  .splitlines())} for name in ("hf", "server")}
    for it in range(stopped - 1, 3):  # what the resumed run played
        a, b = rows["hf"][it], rows["server"][it]
        for key in ("rollout/return", "rollout/success", "rollout/length", "train/tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), (it, key)
        assert b["probe/mean_gap"] < 1e-4  # the fresh server serves the resumed weights
