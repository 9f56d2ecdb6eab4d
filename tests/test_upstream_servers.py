"""The server engine against vLLM 0.33.0 and SGLang 0.5.23's own code.

Each test starts tests/upstream/oracle.py in the side environment ``.venv-upstream``
(``bash scripts/setup_upstream.sh``; ``scripts/test.sh`` makes it): an HTTP server whose
request validation, sampling-parameter conversion, response building, LoRA registry and
admin auth are vLLM's and SGLang's own classes and functions. The defects these tests
pin down were silent with the client before: rollouts sampled with the model's
generation-config defaults, vLLM's raw log-probs at another temperature, SGLang's token
ids lost, SGLang's echoed model name taken as a weight check, a failed adapter load
retried as a network error.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import has_module

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / ".venv-upstream" / "bin" / "python"
ORACLE = ROOT / "tests" / "upstream" / "oracle.py"

pytestmark = [
    pytest.mark.skipif(not (has_module("torch") and has_module("transformers")),
                       reason="needs torch and transformers (pip install -e '.[train]')"),
    pytest.mark.skipif(not UPSTREAM.exists(),
                       reason="needs the vLLM/SGLang side environment: bash "
                              "scripts/setup_upstream.sh"),
]


class Oracle:
    def __init__(self, model: str, kind: str, *flags: str) -> None:
        self.proc = subprocess.Popen([str(UPSTREAM), str(ORACLE), "--kind", kind, "--model",
                                      model, *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            match = re.search(r"oracle on (http://\S+)", line)
            if match:
                self.root = match.group(1)
                self.base = self.root + "/v1"
                break
        else:
            raise RuntimeError("the oracle did not start:\n" + "".join(lines[-40:]))

    def get(self, what: str):
        with urllib.request.urlopen(f"{self.root}/oracle/{what}") as resp:
            return json.loads(resp.read())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def oracle():
    started = []

    def start(model, kind, *flags):
        started.append(Oracle(model, kind, *flags))
        return started[-1]

    yield start
    for o in started:
        o.close()


@pytest.fixture(scope="module")
def sharp_model(tiny_model_path, tmp_path_factory):
    """The tiny model with its final norm scaled 8x: peaked distributions, so that top-k,
    penalties and temperature change log-probs clearly (the random model is near
    uniform)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("sharp") / "model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    return str(path)


def scorer(path):
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import full_logprobs

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return lambda p, c, t: full_logprobs(model, p, c, t).numpy()


def engine(path, o, kind, **kw):
    from transformers import AutoTokenizer

    from gaca_agent.generate.server_engine import ServerEngine

    return ServerEngine(o.base, "tiny", AutoTokenizer.from_pretrained(path), kind, retries=0,
                        **kw)


MESSAGES = [{"role": "user", "content": "Reach the exit."}]


def test_the_oracle_runs_the_pinned_versions():
    out = subprocess.run([str(UPSTREAM), "-c", "import vllm, sglang; print(vllm.__version__, "
                          "sglang.__version__)"], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["0.33.0", "0.5.23"], out.stderr[-2000:]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_requests_state_every_sampling_parameter(kind, sharp_model, oracle):
    """Defect 1: with Qwen2.5-Instruct's generation_config as the server's defaults, the
    server's own conversion of our request yields exactly the plain softmax at the
    configured temperature (no top_k 20, top_p 0.8, repetition penalty 1.05)."""
    o = oracle(sharp_model, kind)
    e = engine(sharp_model, o, kind)
    for t in (1.0, 0.4):
        e.complete(MESSAGES, 4, t, key=5)
    seen = [r["params"] for r in o.get("requests")]
    for t, params in zip((1.0, 0.4), seen):
        assert params == {"temperature": t, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                          "repetition_penalty": 1.0, "presence_penalty": 0.0,
                          "frequency_penalty": 0.0, "seed": 5, "max_tokens": 4}


def test_probe_refuses_vllm_raw_logprobs_and_passes_processed(sharp_model, oracle):
    """Defect 1, the hidden half: vLLM's default --logprobs-mode raw_logprobs reports
    temperature-1 log-probs; the probe measures it, names the flag, and passes once the
    server runs with processed_logprobs."""
    from gaca_agent.generate.probe import ProbeMismatch, check, probe

    score = scorer(sharp_model)
    raw = oracle(sharp_model, "vllm")
    result = probe(engine(sharp_model, raw, "vllm"), score, 0.4, 16)
    assert result.mean_gap > 0.05 and result.raw_gap < 1e-6
    with pytest.raises(ProbeMismatch, match="--logprobs-mode processed_logprobs"):
        check(result, 0.05, "vllm")
    processed = oracle(sharp_model, "vllm", "--logprobs-mode", "processed_logprobs")
    for t in (1.0, 0.4):
        result = probe(engine(sharp_model, processed, "vllm"), score, t, 16)
        assert result.max_gap < 1e-5 and result.seed_honoured
        check(result, 0.05, "vllm")


def test_probe_finds_sampling_defaults(sharp_model, oracle, monkeypatch):
    """A client that leaves top_k and the penalties to the server (as this one did) is
    sampled with the model's defaults; the probe of a processed-log-probs server sees it."""
    import gaca_agent.generate.server_engine as server
    from gaca_agent.generate.probe import ProbeMismatch, check, probe

    o = oracle(sharp_model, "vllm", "--logprobs-mode", "processed_logprobs")
    monkeypatch.setattr(server, "sampling_fields",
                        lambda kind, t: {"temperature": float(t), "top_p": 1.0})
    result = probe(engine(sharp_model, o, "vllm"), scorer(sharp_model), 1.0, 16)
    with pytest.raises(ProbeMismatch, match="generation-config vllm"):
        check(result, 0.05, "vllm")
    assert o.get("requests")[0]["params"]["top_k"] == 20


def test_sglang_token_ids_are_read_exactly(sharp_model, oracle):
    """Defect 2: SGLang returns the sampled ids as choices[].response_token_ids; they are
    used as sampled (not re-tokenized), with the log-probs that go with them."""
    o = oracle(sharp_model, "sglang")
    c = engine(sharp_model, o, "sglang").complete(MESSAGES, 12, 1.0, key=3)
    sampled = o.get("requests")[0]
    assert c.token_source == "server"
    assert (c.prompt_ids, c.completion_ids) == (sampled["prompt_ids"],
                                                sampled["completion_ids"])
    assert c.logprobs == pytest.approx(sampled["logprobs"], abs=1e-9)


def test_sglang_weights_are_checked_by_the_version_it_reports(sharp_model, tmp_path, oracle):
    """Defect 3: SGLang echoes the requested model name, so a stale server is found by
    the weight version it reports itself; a disk update sets it (request bodies checked
    against SGLang's io_struct fields). Seeds: ignored without deterministic inference,
    honoured with it, and the probe says which."""
    from gaca_agent.generate.probe import probe
    from gaca_agent.generate.server_engine import StaleWeights

    o = oracle(sharp_model, "sglang")
    e = engine(sharp_model, o, "sglang")
    e.weight_version = "run-v2"  # what this run synced; the server still serves "default"
    with pytest.raises(StaleWeights, match=r"\['default'\].*run-v2"):
        e.complete(MESSAGES, 4, 1.0, key=1)
    e.update_weights_from_disk(sharp_model, "run-v2")
    assert e.complete(MESSAGES, 4, 1.0, key=1).token_source == "server"
    call = o.get("calls")[-1]
    assert call["path"] == "/update_weights_from_disk"
    assert call["body"]["weight_version"] == "run-v2"
    score = scorer(sharp_model)
    assert not probe(e, score, 1.0, 16).seed_honoured
    seeded = oracle(sharp_model, "sglang", "--deterministic")
    assert probe(engine(sharp_model, seeded, "sglang"), score, 1.0, 16).seed_honoured


def lora(path, out, rank):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(rank)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path),
                           LoraConfig(r=rank, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(out)
    return str(out)


def test_failed_vllm_adapter_load_shows_its_message_and_is_not_retried(sharp_model,
                                                                       tmp_path, oracle):
    """Defect 4: vLLM answers a rank above --max-lora-rank with HTTP 500 (through its own
    OpenAIServingModels); the error carries its message and the load is sent once."""
    from gaca_agent.generate.server_engine import WeightSyncError

    o = oracle(sharp_model, "vllm", "--max-lora-rank", "4")
    e = engine(sharp_model, o, "vllm")
    e.retries = 3
    with pytest.raises(WeightSyncError, match="LoRA rank 8 is greater than max_lora_rank 4"):
        e.load_adapter("run-v1", lora(sharp_model, tmp_path / "r8", 8))
    assert [c["path"] for c in o.get("calls")] == ["/v1/load_lora_adapter"]
    assert e.adapter is None
    e.load_adapter("run-v1", lora(sharp_model, tmp_path / "r4", 4))
    assert e.adapter == "run-v1"
    assert e.complete(MESSAGES, 4, 1.0, key=2).model == "run-v1"


def test_sglang_admin_key_is_sent_to_its_weight_endpoints(sharp_model, tmp_path, oracle):
    from gaca_agent.generate.server_engine import WeightSyncError

    o = oracle(sharp_model, "sglang", "--admin-api-key", "s3cret")
    path = lora(sharp_model, tmp_path / "r4", 4)
    with pytest.raises(WeightSyncError, match="401"):
        engine(sharp_model, o, "sglang").load_adapter("run-v1", path)
    e = engine(sharp_model, o, "sglang", admin_api_key="s3cret")
    e.load_adapter("run-v1", path)
    assert (e.adapter, e.weight_version, e.model) == ("run-v1", "run-v1", "tiny:run-v1")
    assert [c["path"] for c in o.get("calls")][-2:] == ["/load_lora_adapter",
                                                        "/update_weight_version"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_full_weights_from_disk_are_served_and_probed(kind, sharp_model, tiny_model_path,
                                                      tmp_path, oracle):
    """Defect 5: full weights through each server's own update API (vLLM: pause,
    collective_rpc reload_weights, weight version, resume, in dev mode; SGLang:
    update_weights_from_disk); the probe then agrees with the new weights, not the old."""
    from gaca_agent.generate.probe import ProbeMismatch, check, probe
    from gaca_agent.generate.server_engine import WeightSyncError

    flags = ("--logprobs-mode", "processed_logprobs", "--dev-mode") if kind == "vllm" else ()
    o = oracle(tiny_model_path, kind, *flags)
    e = engine(tiny_model_path, o, kind)
    e.update_weights_from_disk(sharp_model, "run-v1")
    assert e.weight_version == "run-v1"
    check(probe(e, scorer(sharp_model), 0.4, 16), 0.05, kind)
    with pytest.raises(ProbeMismatch):
        check(probe(e, scorer(tiny_model_path), 0.4, 16), 0.05, kind)
    if kind == "vllm":
        paths = [c["path"] for c in o.get("calls")]
        assert paths == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
        bare = oracle(tiny_model_path, "vllm")  # no VLLM_SERVER_DEV_MODE: no such routes
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            engine(tiny_model_path, bare, "vllm").update_weights_from_disk(sharp_model, "v1")
