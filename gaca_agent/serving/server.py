"""``gaca-serve``: an OpenAI-compatible chat server for a local model or checkpoint.

    gaca-serve hf:PATH --port 8000          # then: --policy openai:http://127.0.0.1:8000/v1#PATH
    gaca-serve runs/NAME/checkpoints/it-8/model --name ckpt --lora v8=PATH/TO/ADAPTER

Endpoints: ``GET /v1/models``, ``GET /health``, ``POST /v1/chat/completions`` (streaming,
``n``, log-probs, stop, seed, ...: :mod:`gaca_agent.serving.protocol` lists what is
supported; anything else is refused with a 400 naming the parameter), and vLLM's
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (and SGLang's forms: the
same without ``/v1``, ``model: "BASE:ADAPTER"``), and full-weight updates from disk in
both servers' forms (:mod:`gaca_agent.serving.weights`). Concurrent requests are
batched through the trainer's rollout engine (``hf``: keyed sampling, so a request with a
``seed`` gets the same answer whatever it is batched with); log-probs are those of the
sampling distribution softmax(logits / T) (T = 1 at temperature 0), as the trainer records
them. A full queue answers 429. The server binds 127.0.0.1; another address needs
``--api-key`` (clients then send ``Authorization: Bearer KEY``).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gaca_agent.serving import protocol as api
from gaca_agent.serving.protocol import APIError

MAX_BODY = 8 << 20
STREAM_TIMEOUT_S = 600.0


class ChatModel:
    """A transformers model behind the chat API: tokenizer, engine, adapters, batcher."""

    def __init__(self, model: Any, name: str | None = None, tokenizer: Any = None,
                 device: str | None = None, dtype: str = "auto", max_queue: int = 64,
                 max_batch: int = 32, max_tokens: int = 1024) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gaca_agent.generate.engines import HFEngine, eos_ids
        from gaca_agent.serving.adapters import Adapters
        from gaca_agent.serving.batcher import Batcher
        from gaca_agent.serving.weights import Weights

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if isinstance(model, (str, os.PathLike)):
            path = str(model)
            name = name or path
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            if dtype == "auto":
                dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        if tokenizer is None or name is None:
            raise ValueError("pass the tokenizer and a name with a model object")
        model.to(self.device)
        self.name, self.tokenizer = name, tokenizer
        self.engine = HFEngine(model, tokenizer, self.device, batch_size=max_batch)
        self.eos = eos_ids(model, tokenizer)
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.max_tokens = max_tokens
        self.adapters = Adapters(self.engine, name)
        self.weights = Weights(self.engine, self.adapters)
        self.batcher = Batcher(self.engine, self.adapters, max_queue, max_batch)
        self._tokenize_lock = threading.Lock()
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = api.byte_decoder() if type(decoder).__name__ == "ByteLevel" \
            else None

    def prompt_ids(self, messages) -> list[int]:
        with self._tokenize_lock:
            text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=True)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def requests(self, params: api.ChatParams) -> list:
        """The ``n`` engine requests of a checked chat request (400 when it cannot fit)."""
        from gaca_agent.generate.engines import Request

        ids = tuple(self.prompt_ids(params.messages))
        room = self.context - len(ids)
        if room <= 0:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this model's context "
                                f"is {self.context}", "messages", "context_length_exceeded")
        max_tokens = params.max_tokens or min(self.max_tokens, room)
        if max_tokens > room:
            raise APIError(400, f"max_tokens {max_tokens} + {len(ids)} prompt tokens exceed "
                                f"the context of {self.context}", "max_tokens",
                           "context_length_exceeded")
        return [Request(ids, max_tokens, params.temperature, params.top_p, params.stop,
                        sampling_key(params.seed, i), params.top_logprobs)
                for i in range(params.n)]

    def token(self, token_id: int, as_id: bool) -> tuple[str, list[int]]:
        """(text, bytes) of a token as ``logprobs.content`` shows it."""
        text = f"token_id:{token_id}" if as_id else \
            self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text, api.token_bytes(self.tokenizer, token_id, self._byte_level)

    def entry(self, token_id: int, logprob: float, top, params: api.ChatParams) -> dict:
        as_id = params.tokens_as_ids
        return api.token_entry(self.token(token_id, as_id), logprob,
                               [(self.token(t, as_id), lp) for t, lp in (top or [])])

    def response(self, params: api.ChatParams, completions: list, version: str) -> dict:
        """The chat response; ``version``: the weight label the completions were sampled
        with."""
        from gaca_agent.serving.batcher import completion_usage

        choices = []
        for i, c in enumerate(completions):
            choice = {"index": i, "message": {"role": "assistant", "content": c.text},
                      "logprobs": None, "finish_reason": c.finish_reason}
            if params.logprobs:
                tops = c.top_logprobs or [None] * len(c.completion_ids)
                choice["logprobs"] = {"content": [
                    self.entry(t, lp, top, params)
                    for t, lp, top in zip(c.completion_ids, c.logprobs, tops)],
                    "refusal": None}
            if params.return_token_ids:
                choice["token_ids"] = list(c.completion_ids)
            if params.weight_versions:
                choice["weight_versions"] = [{"version": version, "start": 0,
                                              "end": len(c.completion_ids)}]
            choices.append(choice)
        out = {"id": api.new_id(), "object": "chat.completion", "created": api.now(),
               "model": params.model, "choices": choices,
               "usage": api.usage(*completion_usage(completions)),
               "metadata": {"weight_version": version}}
        if params.return_token_ids:
            out["prompt_token_ids"] = list(completions[0].prompt_ids)
        return out

    def close(self) -> None:
        self.batcher.close()


def make_server(model: ChatModel, host: str = "127.0.0.1", port: int = 0,
                api_key: str | None = None) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``model``; loopback only unless an API key is set."""
    from gaca_envs.net import bearer_ok, is_loopback

    if not is_loopback(host) and not api_key:
        raise ValueError(f"refusing to serve on {host!r} without an API key: pass --api-key "
                         "(clients send it as a Bearer token) or bind 127.0.0.1")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        # ----------------------------------------------------------- plumbing
        def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, err: APIError) -> None:
            headers = {"Retry-After": "1"} if err.status == 429 else None
            if not getattr(self, "_consumed", False) and self.headers.get("Content-Length"):
                self.close_connection = True  # an unread body must not become a request
            self._send(err.status, err.body(), headers)

        def _authorized(self) -> bool:
            return bearer_ok(self.headers.get("Authorization", ""), api_key)

        def _body(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise APIError(400, "Content-Length is not a number") from None
            if length < 0 or length > MAX_BODY:
                raise APIError(413, f"request body over {MAX_BODY} bytes")
            raw = self.rfile.read(length)
            self._consumed = True
            try:
                return json.loads(raw or b"null")
            except json.JSONDecodeError as err:
                raise APIError(400, f"the body is not valid JSON: {err}") from err

        def _route(self, method: str):
            self._consumed = False
            path = self.path.split("?", 1)[0].rstrip("/")
            routes = {("GET", "/health"): self.health, ("GET", "/v1/models"): self.models,
                      ("POST", "/v1/chat/completions"): self.chat,
                      ("POST", "/v1/load_lora_adapter"): self.load_adapter,
                      ("POST", "/v1/unload_lora_adapter"): self.unload_adapter,
                      ("POST", "/load_lora_adapter"): self.load_adapter,  # SGLang's paths
                      ("POST", "/unload_lora_adapter"): self.unload_adapter,
                      ("POST", "/pause"): self.pause, ("POST", "/resume"): self.resume,
                      ("GET", "/is_paused"): self.is_paused,
                      ("POST", "/collective_rpc"): self.collective_rpc,
                      ("POST", "/update_weight_version"): self.update_weight_version,
                      ("GET", "/weight_info"): self.weight_info,
                      ("GET", "/get_weight_version"): self.weight_info,
                      ("POST", "/update_weights_from_disk"): self.update_weights_from_disk}
            handler = routes.get((method, path))
            try:
                if handler is None:
                    raise APIError(404, f"no route {method} {path}")
                if path != "/health" and not self._authorized():
                    raise APIError(401, "missing or wrong API key (Authorization: Bearer "
                                        "KEY)", None, "invalid_api_key")
                handler()
            except APIError as err:
                self._error(err)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as err:  # a defect: answered, and the server keeps serving
                self._error(_as_api_error(err))

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        # ----------------------------------------------------------- endpoints
        def health(self) -> None:
            self._send(200, {"status": "ok"})

        def models(self) -> None:
            created = api.now()
            data = [{"id": model.name, "object": "model", "created": created,
                     "owned_by": "gaca", "root": model.name, "parent": None}]
            data += [{"id": name, "object": "model", "created": created, "owned_by": "gaca",
                      "root": path, "parent": model.name}
                     for name, path in model.adapters.paths.items()]
            self._send(200, {"object": "list", "data": data})

        def load_adapter(self) -> None:
            body = self._body()
            if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str) \
                    or not isinstance(body.get("lora_path"), str):
                raise APIError(400, "give lora_name and lora_path", "lora_name")
            name = body["lora_name"]
            model.adapters.load(name, body["lora_path"], bool(body.get("load_inplace")))
            self._text(200, f"Success: LoRA adapter '{name}' added successfully.")

        def unload_adapter(self) -> None:
            body = self._body()
            if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str):
                raise APIError(400, "give lora_name", "lora_name")
            model.adapters.unload(body["lora_name"])
            self._text(200, f"Success: LoRA adapter '{body['lora_name']}' removed "
                            "successfully.")

        def pause(self) -> None:
            from urllib.parse import parse_qs

            query = parse_qs(self.path.partition("?")[2])
            mode = (query.get("mode") or ["abort"])[0]
            if mode not in ("abort", "wait", "keep"):
                raise APIError(400, f"mode must be abort, wait or keep, got {mode!r}", "mode")
            self._body()
            model.weights.paused.set()
            self._send(200, {"status": "paused"})

        def resume(self) -> None:
            self._body()
            model.weights.paused.clear()
            self._send(200, {"status": "resumed"})

        def is_paused(self) -> None:
            self._send(200, {"is_paused": model.weights.paused.is_set()})

        def collective_rpc(self) -> None:
            body = self._body()
            if not isinstance(body, dict) or body.get("method") != "reload_weights":
                raise APIError(400, "gaca-serve's collective_rpc runs reload_weights only",
                               "method")
            kwargs = body.get("kwargs") or {}
            path = kwargs.get("weights_path")
            if not isinstance(path, str) or set(kwargs) - {"weights_path",
                                                           "is_checkpoint_format"}:
                raise APIError(400, "reload_weights takes kwargs {weights_path: DIR}",
                               "kwargs")
            model.weights.reload(path)
            self._send(200, {"results": [None]})

        def update_weight_version(self) -> None:
            body = self._body()
            if not isinstance(body, dict):
                raise APIError(400, "give new_version", "new_version")
            model.weights.set_version(body.get("new_version"))
            self._send(200, {"success": True, "new_version": model.weights.version})

        def weight_info(self) -> None:
            self._send(200, {"weight_version": model.weights.version})

        def update_weights_from_disk(self) -> None:
            body = self._body()
            if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
                raise APIError(400, "give model_path", "model_path")
            try:
                model.weights.reload(body["model_path"])
            except APIError as err:
                return self._send(400, {"success": False, "message": err.message,
                                        "num_paused_requests": 0})
            if body.get("weight_version") is not None:
                model.weights.set_version(body["weight_version"])
            self._send(200, {"success": True, "message": "Succeeded to update model weights.",
                             "num_paused_requests": 0})

        def _text(self, code: int, text: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def chat(self) -> None:
            from gaca_agent.serving.batcher import Job

            params = api.parse_chat(self._body())
            if model.weights.paused.is_set():
                raise APIError(503, "generation is paused (POST /resume)")
            served = model.adapters.resolve(params.model)
            version = model.weights.version
            job = Job(served, model.requests(params), params.stream)
            model.batcher.submit(job)
            if params.stream:
                return self._stream(params, job)
            try:
                kind, *rest = job.events.get(timeout=STREAM_TIMEOUT_S)
            except queue.Empty:
                job.cancelled = True
                raise APIError(503, "generation timed out") from None
            if kind == "error":
                raise _as_api_error(rest[0])
            self._send(200, model.response(params, rest[0], version))

        def _stream(self, params: api.ChatParams, job) -> None:
            from gaca_agent.serving.stream import ChoiceStream

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            id_, created = api.new_id(), api.now()

            def send(payload: dict | str) -> None:
                data = payload if isinstance(payload, str) else json.dumps(payload)
                event = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()

            def chunk(choices: list[dict], **extra) -> dict:
                return api.chunk(id_, created, params.model, choices,
                                 include_usage=params.include_usage, **extra)

            def choice(i: int, delta: dict, entries=None, tokens=None, reason=None) -> dict:
                out = {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason}
                if params.logprobs and entries is not None:
                    out["logprobs"] = {"content": entries, "refusal": None}
                if params.return_token_ids and tokens is not None:
                    out["token_ids"] = tokens
                return out

            streams = [ChoiceStream(model.tokenizer, model.eos, r.stop, r.max_new_tokens)
                       for r in job.requests]
            counted = [0] * len(streams)
            try:
                first = {"prompt_token_ids": list(job.requests[0].prompt_ids)} \
                    if params.return_token_ids else {}
                send(chunk([choice(i, {"role": "assistant", "content": ""})
                            for i in range(len(streams))], **first))
                while True:
                    try:
                        kind, *rest = job.events.get(timeout=STREAM_TIMEOUT_S)
                    except queue.Empty:
                        raise APIError(503, "generation timed out") from None
                    if kind == "error":
                        raise _as_api_error(rest[0])
                    if kind == "done":
                        break
                    i, token, lp, top = rest
                    belongs, delta = streams[i].push(token)
                    if belongs:
                        counted[i] += 1
                        send(chunk([choice(i, {"content": delta},
                                           [model.entry(token, lp, top, params)], [token])]))
                completions = rest[0]
                for i, c in enumerate(completions):
                    tail = c.completion_ids[counted[i]:]  # tokens not streamed one by one
                    tops = (c.top_logprobs or [None] * len(c.completion_ids))[counted[i]:]
                    entries = [model.entry(t, lp, top, params) for t, lp, top in
                               zip(tail, c.logprobs[counted[i]:], tops)]
                    text = streams[i].rest(c.text)
                    if text or tail:
                        send(chunk([choice(i, {"content": text}, entries, list(tail))]))
                    send(chunk([choice(i, {}, reason=c.finish_reason)]))
                if params.include_usage:
                    from gaca_agent.serving.batcher import completion_usage

                    send(chunk([], usage_=api.usage(*completion_usage(completions))))
                send("[DONE]")
            except APIError as err:
                send({"error": err.body()["error"]})
            except (BrokenPipeError, ConnectionResetError):
                job.cancelled = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def sampling_key(seed: int | None, choice: int) -> int:
    """The engine key of a choice: choice 0 of a request with ``seed`` s samples with key
    s itself, exactly as the trainer's ``hf`` engine samples a turn whose key is s (so a
    rollout through the server equals a local one); choice i > 0 with row_key(s, i);
    without a seed, a random key."""
    from gaca_agent.generate.sampling import row_key

    if seed is None:
        return secrets.randbits(63)
    return seed if choice == 0 else row_key(seed, choice)


def _as_api_error(err: BaseException) -> APIError:
    if isinstance(err, APIError):
        return err
    return APIError(500, f"generation failed: {type(err).__name__}: {err}")
