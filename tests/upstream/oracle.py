"""An inference server built from vLLM's and SGLang's own code, for the client's tests.

It runs in the side environment ``.venv-upstream`` (``bash scripts/setup_upstream.sh``:
the vLLM and SGLang wheels without their CUDA dependencies, beside the project's CPU
torch), since neither server can run here. What the real servers do in Python is done
by their code: request bodies are validated by their request models (a refusal is their
400), the sampling parameters are their own conversion of the request with the model's
``generation_config.json`` as defaults (vLLM ``--generation-config auto``, SGLang
``--sampling-defaults model``), responses are built by their response models and vLLM's
chat log-prob builder, adapter loads go through vLLM's ``OpenAIServingModels``, SGLang's
admin endpoints check keys with SGLang's ``decide_request_auth`` and the fields of its
``io_struct`` request classes. What runs on their GPUs is written here after their
samplers: penalties, temperature, min-p, top-k, top-p, a seeded draw (SGLang honours the
seed only with ``--enable-deterministic-inference``), and the log-probs each reports
(vLLM ``--logprobs-mode raw_logprobs`` (its default) or ``processed_logprobs``; SGLang
the temperature-scaled distribution before top-k/top-p).

    .venv-upstream/bin/python tests/upstream/oracle.py --kind vllm --model PATH
        [--logprobs-mode processed_logprobs] [--max-lora-rank 8] [--dev-mode]
        [--deterministic] [--admin-api-key KEY] [--generation-config JSON]

It prints ``oracle on http://127.0.0.1:PORT`` when ready. ``GET /oracle/requests`` lists,
per chat request, the sampling parameters the server's own conversion produced and the
ids it sampled; ``GET /oracle/calls`` every call to the other endpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import ast
import json
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

QWEN_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
"""Qwen2.5-7B-Instruct's generation_config.json sampling fields (what both servers fill
in when a request leaves them out)."""

NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "top_p": 1.0}


def struct_fields(module_file: str, class_name: str) -> tuple[set[str], set[str]]:
    """(all fields, required fields) of a msgspec/dataclass request class in a source file
    of the installed package, read from its annotations (SGLang's ``io_struct`` imports its
    GPU kernels, which cannot be imported here)."""
    tree = ast.parse(Path(module_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            fields, required = set(), set()
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields.add(item.target.id)
                    if item.value is None:
                        required.add(item.target.id)
            return fields, required
    raise LookupError(f"{class_name} not found in {module_file}: the upstream code moved")


class Sampler:
    """The sampling distribution and reported log-probs of one server kind."""

    def __init__(self, kind: str, logprobs_mode: str, deterministic: bool) -> None:
        self.kind, self.mode, self.deterministic = kind, logprobs_mode, deterministic

    def step(self, logits, history: list[int], output: list[int], p: dict, gen):
        """(token, reported log-prob) for one position (``p``: the normalised params)."""
        import torch

        raw = torch.log_softmax(logits.double(), -1)
        x = logits.double().clone()
        rep = p["repetition_penalty"]
        if rep != 1.0:
            seen = torch.tensor(sorted(set(history + output)), dtype=torch.long)
            vals = x[seen]
            x[seen] = torch.where(vals > 0, vals / rep, vals * rep)
        if output and (p["frequency_penalty"] or p["presence_penalty"]):
            counts = torch.bincount(torch.tensor(output), minlength=x.numel()).double()
            x -= p["frequency_penalty"] * counts + p["presence_penalty"] * (counts > 0)
        t = p["temperature"]
        if t <= 1e-5:
            token = int(torch.argmax(x))
            return token, float(raw[token])
        x = x / t
        penalised = torch.log_softmax(x, -1)
        probs = torch.softmax(x, -1)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if p["min_p"] > 0:
            keep &= probs >= p["min_p"] * probs.max()
        k = p["top_k"]
        if k is not None and 0 < k < x.numel():
            keep &= x >= torch.topk(x, k).values[-1]
        if p["top_p"] < 1.0:
            order = torch.argsort(probs, descending=True)
            cum = torch.cumsum(probs[order], 0)
            drop = cum - probs[order] > p["top_p"]
            mask = torch.ones_like(keep)
            mask[order[drop]] = False
            keep &= mask
        final = torch.where(keep, x, torch.tensor(float("-inf"), dtype=x.dtype))
        processed = torch.log_softmax(final, -1)
        token = int(torch.multinomial(processed.exp(), 1, generator=gen))
        if self.kind == "sglang":
            return token, float(penalised[token])
        return token, float((processed if self.mode == "processed_logprobs" else raw)[token])


def normalised(kind: str, params) -> dict:
    """The sampling fields the sampler reads, from the server's own conversion."""
    get = (lambda k: params.get(k)) if isinstance(params, dict) else \
        (lambda k: getattr(params, k))
    out = {k: get(k) for k in ("temperature", "top_p", "top_k", "min_p",
                               "repetition_penalty", "presence_penalty", "frequency_penalty")}
    out["seed"] = get("sampling_seed") if kind == "sglang" else get("seed")
    out["max_tokens"] = get("max_new_tokens") if kind == "sglang" else get("max_tokens")
    if out["top_k"] is not None and out["top_k"] < 0:
        out["top_k"] = 0  # both servers: -1 disables top-k
    return out


class Oracle:
    def __init__(self, args) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.args, self.kind = args, args.kind
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        self.model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        self.model.eval()
        self.defaults = json.loads(args.generation_config) if args.generation_config \
            else dict(QWEN_DEFAULTS)
        self.sampler = Sampler(args.kind, args.logprobs_mode, args.deterministic)
        self.requests: list[dict] = []
        self.calls: list[dict] = []
        self.version = "default"
        self.paused = False
        self.adapters: dict[str, str] = {}
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        if self.kind == "vllm":
            self.models = self._vllm_models()

    # ------------------------------------------------------------- vLLM's LoRA registry
    def _vllm_models(self):
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels

        oracle = self

        class Engine:  # what OpenAIServingModels asks of vLLM's engine client
            model_config = types.SimpleNamespace(max_model_len=4096, model=oracle.args.model,
                                                 served_model_name=oracle.args.name)
            renderer = input_processor = None

            async def add_lora(self, request):
                config = Path(request.lora_path) / "adapter_config.json"
                if not config.is_file():
                    raise ValueError(f"Loading lora {request.lora_name} failed: No adapter "
                                     f"found for {request.lora_path}")
                rank = json.loads(config.read_text())["r"]
                if rank > oracle.args.max_lora_rank:  # vLLM's worker raises this
                    raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank "
                                     f"{oracle.args.max_lora_rank}.")
                return True

            async def remove_lora(self, lora_id):
                return True

        paths = [_base_model_path(self.args.name, self.args.model)]
        try:
            return OpenAIServingModels(Engine(), paths)
        except Exception as err:  # the upstream constructor moved
            raise SystemExit(f"cannot build vLLM's OpenAIServingModels: {err!r}")

    # ------------------------------------------------------------- generation
    def generate(self, prompt: list[int], p: dict) -> tuple[list[int], list[float], str]:
        import torch

        honours_seed = self.kind == "vllm" or self.args.deterministic
        gen = torch.Generator()
        if p["seed"] is not None and honours_seed:
            gen.manual_seed(int(p["seed"]) % (1 << 63))
        else:
            gen.seed()
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        out, lps = [], []
        finish = "length"
        with torch.no_grad():
            for _ in range(int(p["max_tokens"] or 16)):
                logits = self.model(torch.tensor([prompt + out])).logits[0, -1]
                token, lp = self.sampler.step(logits, prompt, out, p, gen)
                out.append(token)
                lps.append(lp)
                if token == eos:
                    finish = "stop"
                    break
        return out, lps, finish

    def chat(self, body: dict, headers) -> tuple[int, dict]:
        if self.paused and self.kind == "vllm":
            return 503, {"error": {"message": "generation is paused", "code": 503}}
        try:
            request = self._request_model()(**body)
        except Exception as err:  # their validation error: their 400
            return 400, {"error": {"message": str(err), "type": "BadRequestError",
                                   "code": 400}}
        if self.kind == "vllm":
            max_tokens = request.max_completion_tokens or request.max_tokens or 16
            params = request.to_sampling_params(max_tokens, self.defaults)
        else:
            params = request.to_sampling_params([], self.defaults)
        p = normalised(self.kind, params)
        model_name = body.get("model")
        if self.kind == "vllm" and model_name not in (self.args.name, *self._vllm_loras()):
            return 404, {"error": {"message": f"The model `{model_name}` does not exist.",
                                   "type": "NotFoundError", "code": 404}}
        messages = [dict(m) for m in body["messages"]]
        chat = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        prompt = self.tokenizer(chat, add_special_tokens=False)["input_ids"]
        with self.lock:
            ids, lps, finish = self.generate(prompt, p)
        self.requests.append({"body": body, "params": p, "prompt_ids": prompt,
                              "completion_ids": ids, "logprobs": lps})
        build = self._vllm_response if self.kind == "vllm" else self._sglang_response
        return 200, build(request, prompt, ids, lps, finish)

    def _request_model(self):
        if self.kind == "vllm":
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        else:
            from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
        return ChatCompletionRequest

    def _vllm_loras(self) -> list[str]:
        return list(self.models.lora_requests)

    def _text(self, ids: list[int]) -> str:
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        return self.tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True)

    def _vllm_response(self, request, prompt, ids, lps, finish) -> dict:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionResponse, ChatCompletionResponseChoice, ChatMessage)
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.serve.engine.protocol import UsageInfo
        from vllm.logprobs import Logprob
        from vllm.outputs import WeightVersionSpan
        from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

        logprobs = None
        if request.logprobs:
            decoded = convert_ids_list_to_tokens(self.tokenizer, ids)
            tops = [{t: Logprob(lp, 1, d)} for t, lp, d in zip(ids, lps, decoded)]
            builder = types.SimpleNamespace(return_tokens_as_token_ids=False)
            builder._get_decoded_token = OpenAIServingChat._get_decoded_token
            builder._get_top_logprobs = types.MethodType(OpenAIServingChat._get_top_logprobs,
                                                         builder)
            logprobs = OpenAIServingChat._create_chat_logprobs(
                builder, ids, tops, self.tokenizer, request.top_logprobs)
        choice = ChatCompletionResponseChoice(
            index=0, message=ChatMessage(role="assistant", content=self._text(ids)),
            logprobs=logprobs, finish_reason=finish,
            token_ids=ids if request.return_token_ids else None,
            weight_versions=([WeightVersionSpan(self.version, 0, len(ids))]
                             if request.return_weight_versions else None))
        model = request.model if request.model in self._vllm_loras() else self.args.name
        response = ChatCompletionResponse(
            model=model, choices=[choice],
            usage=UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(ids),
                            total_tokens=len(prompt) + len(ids)),
            prompt_token_ids=prompt if request.return_token_ids else None)
        return json.loads(response.model_dump_json(exclude_unset=False))

    def _sglang_response(self, request, prompt, ids, lps, finish) -> dict:
        from sglang.srt.entrypoints.openai.protocol import (
            ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionTokenLogprob,
            ChatMessage, ChoiceLogprobs, SglExt, UsageInfo)

        logprobs = None
        if request.logprobs:
            content = []
            for t, lp in zip(ids, lps):
                text = self.tokenizer.decode([t])
                content.append(ChatCompletionTokenLogprob(
                    token=text, bytes=list(text.encode("utf-8")), logprob=lp,
                    top_logprobs=[]))
            logprobs = ChoiceLogprobs(content=content)
        choice = ChatCompletionResponseChoice(
            index=0, message=ChatMessage(role="assistant", content=self._text(ids)),
            logprobs=logprobs, finish_reason=finish,
            prompt_token_ids=prompt if (request.return_prompt_token_ids
                                        or request.return_token_ids) else None,
            response_token_ids=ids if request.return_token_ids else None)
        ext = None
        if request.return_input_ids_in_sglext or request.return_output_ids_in_sglext:
            ext = SglExt(input_ids=prompt if request.return_input_ids_in_sglext else None,
                         output_ids=[ids] if request.return_output_ids_in_sglext else None)
        response = ChatCompletionResponse(
            id="oracle", model=request.model, choices=[choice],
            usage=UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(ids),
                            total_tokens=len(prompt) + len(ids)),
            metadata={"weight_version": self.version}, sglext=ext)
        return json.loads(response.model_dump_json())

    # ------------------------------------------------------------- admin endpoints
    def admin(self, method: str, path: str, query: dict, body, headers) -> tuple[int, object]:
        self.calls.append({"method": method, "path": path, "query": query, "body": body})
        if self.kind == "sglang":
            return self._sglang_admin(path, body, headers)
        return self._vllm_admin(path, query, body)

    def _vllm_admin(self, path: str, query: dict, body) -> tuple[int, object]:
        from vllm.entrypoints.serve.lora.protocol import (LoadLoRAAdapterRequest,
                                                          UnloadLoRAAdapterRequest)

        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            model = LoadLoRAAdapterRequest if "unload" not in path else UnloadLoRAAdapterRequest
            try:
                request = model(**body)
            except Exception as err:
                return 400, {"error": {"message": str(err), "code": 400}}
            call = (self.models.load_lora_adapter if "unload" not in path
                    else self.models.unload_lora_adapter)
            result = self.loop.run_until_complete(call(request))
            if isinstance(result, str):
                return 200, result
            data = json.loads(result.model_dump_json())
            return int(data.get("error", {}).get("code") or 500), data
        rl = ("/pause", "/resume", "/collective_rpc", "/update_weight_version", "/weight_info",
              "/is_paused")
        if path in rl and not self.args.dev_mode:
            return 404, {"detail": "Not Found"}  # vLLM mounts them with VLLM_SERVER_DEV_MODE=1
        if path == "/pause":
            if query.get("mode", "abort") not in ("abort", "wait", "keep"):
                return 422, {"detail": f"bad mode {query.get('mode')}"}
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/is_paused":
            return 200, {"is_paused": self.paused}
        if path == "/weight_info":
            return 200, {"weight_version": self.version}
        if path == "/update_weight_version":
            if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
                return 422, {"detail": "new_version (a string) is required"}
            self.version = body["new_version"]
            return 200, {"success": True, "new_version": self.version}
        if path == "/collective_rpc":
            if not isinstance(body, dict) or "method" not in body:
                return 400, {"detail": "Missing 'method' in request body"}
            kwargs = body.get("kwargs", {})
            if body["method"] != "reload_weights" or set(kwargs) - {"weights_path",
                                                                     "is_checkpoint_format"}:
                return 500, {"detail": f"unknown call {body}"}
            if any(not isinstance(v, str) for v in kwargs.values()):
                return 500, {"detail": "collective_rpc passes only string arguments"}
            if not self.paused:
                return 500, {"detail": "reload_weights while generating (call /pause)"}
            return self._load_weights(kwargs["weights_path"])
        return 404, {"detail": "Not Found"}

    def _sglang_admin(self, path: str, body, headers) -> tuple[int, object]:
        from sglang.srt.utils.auth import decide_request_auth, AuthLevel

        decision = decide_request_auth(
            method="POST", path=path, auth_level=AuthLevel.ADMIN_OPTIONAL, api_key=None,
            admin_api_key=self.args.admin_api_key,
            authorization_header=headers.get("Authorization"))
        if not decision.allowed:
            return decision.error_status_code, {"error": "Unauthorized"}

        classes = {"/load_lora_adapter": "LoadLoRAAdapterReqInput",
                   "/unload_lora_adapter": "UnloadLoRAAdapterReqInput",
                   "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
                   "/update_weight_version": "UpdateWeightVersionReqInput"}
        if path == "/get_weight_version":
            return 200, {"weight_version": self.version}
        if path not in classes:
            return 404, {"detail": "Not Found"}
        fields, required = struct_fields(IO_STRUCT, classes[path])
        fields |= {"rid", "http_worker_ipc"}  # BaseReq's
        if not isinstance(body, dict) or set(body) - fields or required - set(body):
            return 422, {"detail": f"{classes[path]} takes {sorted(fields)}, requires "
                                   f"{sorted(required)}; got {body}"}
        if path == "/update_weight_version":
            self.version = body["new_version"]
            return 200, {"success": True, "new_version": self.version}
        if path == "/update_weights_from_disk":
            code, out = self._load_weights(body["model_path"])
            if code == 200 and body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return (200 if code == 200 else 400), {"success": code == 200,
                                                   "message": str(out),
                                                   "num_paused_requests": 0}
        if path == "/load_lora_adapter":
            if not (Path(body["lora_path"]) / "adapter_config.json").is_file():
                return 400, {"success": False, "error_message": "no adapter"}
            self.adapters[body["lora_name"]] = body["lora_path"]
            return 200, {"success": True, "loaded_adapters": dict(self.adapters)}
        self.adapters.pop(body["lora_name"], None)
        return 200, {"success": True, "loaded_adapters": dict(self.adapters)}

    def _load_weights(self, path: str) -> tuple[int, object]:
        import torch
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            return 500, {"detail": f"no safetensors under {path}"}
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        with self.lock, torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected:
                return 500, {"detail": f"unexpected weights {unexpected[:3]}"}
        return 200, {"results": [None]}


def _base_model_path(name: str, path: str):
    from vllm.entrypoints.openai.models.protocol import BaseModelPath

    return BaseModelPath(name=name, model_path=path)


IO_STRUCT = ""


def main() -> None:
    global IO_STRUCT
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["vllm", "sglang"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", default="tiny")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--logprobs-mode", default="raw_logprobs",
                        choices=["raw_logprobs", "processed_logprobs"])
    parser.add_argument("--generation-config", default=None)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--dev-mode", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--admin-api-key", default=None)
    args = parser.parse_args()
    import importlib.util

    IO_STRUCT = importlib.util.find_spec("sglang").submodule_search_locations[0] + \
        "/srt/managers/io_struct.py"
    oracle = Oracle(args)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, payload) -> None:
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            from urllib.parse import parse_qsl, urlsplit

            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            try:
                if url.path == "/oracle/requests":
                    return self._send(200, oracle.requests)
                if url.path == "/oracle/calls":
                    return self._send(200, oracle.calls)
                if url.path == "/health":
                    return self._send(200, {})
                if url.path == "/v1/chat/completions":
                    return self._send(*oracle.chat(body, self.headers))
                return self._send(*oracle.admin(method, url.path, dict(parse_qsl(url.query)),
                                                body, self.headers))
            except Exception as err:  # a defect of the oracle: shown to the test
                import traceback

                self._send(599, {"oracle_error": traceback.format_exc()[-2000:],
                                 "error": repr(err)})

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"oracle on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
