"""gaca-serve's HTTP handler: routing, the API key, JSON bodies, the chat endpoint
(whole and streamed) and the adapter and weight endpoints of vLLM and SGLang."""

from __future__ import annotations

import json
import logging
import queue
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from gaca_agent.serving import protocol as api
from gaca_agent.serving.protocol import APIError
from gaca_envs.net import bearer_ok

MAX_BODY = 8 << 20
STREAM_TIMEOUT_S = 600.0
#: A connection that sends nothing (an idle keep-alive, a body that never arrives) for this
#: long is closed, so it cannot hold a server thread forever.
REQUEST_TIMEOUT_S = 60.0
#: One INFO line per chat request taken and per request answered (id, tokens, time):
#: ``gaca-serve`` shows them; a slow model's queue can be seen growing.
log = logging.getLogger("gaca_agent.serving")


class Handler(BaseHTTPRequestHandler):
    """One request to gaca-serve; the model and key are the server's (:class:`ChatServer`)."""

    protocol_version = "HTTP/1.1"

    @property
    def model(self):
        return self.server.model

    def log_message(self, *args):  # quiet
        pass

    def setup(self) -> None:
        self.timeout = getattr(self.server, "request_timeout_s", REQUEST_TIMEOUT_S)
        super().setup()

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
        return bearer_ok(self.headers.get("Authorization", ""), self.server.api_key)

    def _body(self) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # its chunks must not be read as a next request
            raise APIError(411, "send the body with a Content-Length (chunked bodies are "
                                "not read)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise APIError(400, "Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY:
            raise APIError(413, f"request body over {MAX_BODY} bytes")
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            raise APIError(408, f"the body did not arrive within {self.timeout:g} s") from None
        self._consumed = True
        if len(raw) < length:  # the client closed before sending what it announced
            self.close_connection = True
            raise APIError(400, f"the body ended after {len(raw)} of {length} bytes")
        try:
            return json.loads(raw or b"null")
        except ValueError as err:  # bad JSON, or bytes in no Unicode encoding JSON allows
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
                  ("POST", "/update_weights_from_disk"): self.update_weights_from_disk,
                  ("POST", "/weight_checker"): self.weight_checker,
                  ("POST", "/pause_generation"): self.pause_generation,
                  ("POST", "/continue_generation"): self.resume,
                  ("POST", "/init_weights_update_group"): self.weight_group("init"),
                  ("POST", "/update_weights_from_distributed"): self.weight_group("update"),
                  ("POST", "/destroy_weights_update_group"): self.weight_group("destroy")}
        handler = routes.get((method, path))
        try:
            if not self._authorized():  # every path, /health too, once a key is set
                raise APIError(401, "missing or wrong API key (Authorization: Bearer "
                                    "KEY)", None, "invalid_api_key")
            if handler is None:
                raise APIError(404, f"no route {method} {path}")
            handler()
        except APIError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as err:  # a defect: answered, and the server keeps serving
            self._error(as_api_error(err))

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def _no_such_method(self):
        self._route(self.command)  # no route takes it: a JSON 404, never a bare 501

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _no_such_method

    # ----------------------------------------------------------- endpoints
    def health(self) -> None:
        self._send(200, {"status": "ok"})

    def models(self) -> None:
        created = api.now()
        data = [{"id": self.model.name, "object": "model", "created": created,
                 "owned_by": "gaca", "root": self.model.name, "parent": None}]
        data += [{"id": name, "object": "model", "created": created, "owned_by": "gaca",
                  "root": path, "parent": self.model.name}
                 for name, path in self.model.adapters.paths.items()]
        self._send(200, {"object": "list", "data": data})

    def load_adapter(self) -> None:
        body = self._body()
        if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str) \
                or not isinstance(body.get("lora_path"), str):
            raise APIError(400, "give lora_name and lora_path", "lora_name")
        name = body["lora_name"]
        self.model.adapters.load(name, body["lora_path"], bool(body.get("load_inplace")))
        self._text(200, f"Success: LoRA adapter '{name}' added successfully.")

    def unload_adapter(self) -> None:
        body = self._body()
        if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str):
            raise APIError(400, "give lora_name", "lora_name")
        self.model.adapters.unload(body["lora_name"])
        self._text(200, f"Success: LoRA adapter '{body['lora_name']}' removed "
                        "successfully.")

    def pause(self) -> None:
        from urllib.parse import parse_qs

        query = parse_qs(self.path.partition("?")[2])
        self._body()
        self.model.weights.pause((query.get("mode") or ["abort"])[0], self.model.batcher)
        self._send(200, {"status": "paused"})

    def pause_generation(self) -> None:
        """SGLang's pause: ``abort`` as vLLM's; ``in_place`` and ``retract`` hold work."""
        body = self._body()
        mode = (body or {}).get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            raise APIError(400, f"mode must be abort, retract or in_place, got {mode!r}",
                           "mode")
        self.model.weights.pause("abort" if mode == "abort" else "keep", self.model.batcher)
        self._send(200, {"success": True, "message": "paused"})

    def resume(self) -> None:
        self._body()
        self.model.weights.resume()
        self._send(200, {"status": "resumed"})

    def is_paused(self) -> None:
        self._send(200, {"is_paused": self.model.weights.paused})

    def weight_checker(self) -> None:
        body = self._body()
        action = body.get("action") if isinstance(body, dict) else None
        if action not in ("checksum", "compare"):
            raise APIError(400, "action must be checksum or compare", "action")
        sums = self.model.weights.checksums()
        if action == "checksum":
            return self._send(200, {"checksums": sums})
        baseline = body.get("baseline")
        if not isinstance(baseline, dict):
            raise APIError(400, "action 'compare' requires a 'baseline' object", "baseline")
        bad = sorted(k for k in sums.keys() | baseline.keys() if sums.get(k) != baseline.get(k))
        self._send(200, {"match": not bad, "mismatches": bad})

    def weight_group(self, action: str):
        """SGLang's distributed weight update (:mod:`gaca_agent.serving.receiver`)."""
        def endpoint() -> None:
            getattr(self.model.receiver, action)(self._body())
            self._send(200, {"success": True, "message": f"weight group: {action} done"})
        return endpoint

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
        self.model.weights.reload(path)
        self._send(200, {"results": [None]})

    def update_weight_version(self) -> None:
        body = self._body()
        if not isinstance(body, dict):
            raise APIError(400, "give new_version", "new_version")
        self.model.weights.set_version(body.get("new_version"))
        self._send(200, {"success": True, "new_version": self.model.weights.version})

    def weight_info(self) -> None:
        self._send(200, {"weight_version": self.model.weights.version})

    def update_weights_from_disk(self) -> None:
        body = self._body()
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            raise APIError(400, "give model_path", "model_path")
        try:
            self.model.weights.reload(body["model_path"], body.get("weight_version"))
        except APIError as err:
            return self._send(400, {"success": False, "message": err.message,
                                    "num_paused_requests": 0})
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
        if self.model.weights.paused and self.model.weights.refusing:
            raise APIError(503, "generation is paused (POST /resume)")
        served = self.model.adapters.resolve(params.model)
        job = Job(served, self.model.requests(params), params.stream)
        t0 = time.perf_counter()
        self.model.batcher.submit(job)
        log.info("chat request from %s: model %s, %d choice(s), up to %s tokens",
                 self.client_address[0], params.model, len(job.requests),
                 params.max_tokens or "the default")
        if params.stream:
            return self._stream(params, job)
        try:
            kind, *rest = job.events.get(timeout=STREAM_TIMEOUT_S)
        except queue.Empty:
            job.cancelled = True
            raise APIError(503, "generation timed out") from None
        if kind == "error":
            raise as_api_error(rest[0])
        response = self.model.response(params, *rest)  # completions, their version
        usage = response.get("usage") or {}
        log.info("chat %s: %s prompt + %s completion tokens in %.2f s", response.get("id"),
                 usage.get("prompt_tokens"), usage.get("completion_tokens"),
                 time.perf_counter() - t0)
        self._send(200, response)

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

        streams = [ChoiceStream(self.model.tokenizer, self.model.eos, r.stop, r.max_new_tokens)
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
                    raise as_api_error(rest[0])
                if kind == "done":
                    break
                i, token, lp, top = rest
                belongs, delta = streams[i].push(token)
                if belongs:
                    counted[i] += 1
                    send(chunk([choice(i, {"content": delta},
                                       [self.model.entry(token, lp, top, params)], [token])]))
            self._stream_end(params, rest[0], streams, counted, send, chunk, choice)
        except APIError as err:
            send({"error": err.body()["error"]})
        except (BrokenPipeError, ConnectionResetError):
            job.cancelled = True
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_end(self, params, completions, streams, counted, send, chunk, choice) -> None:
        """The tokens of each choice not streamed one by one, its finish reason, the usage
        (when asked) and ``[DONE]``."""
        for i, c in enumerate(completions):
            tail = c.completion_ids[counted[i]:]
            tops = (c.top_logprobs or [None] * len(c.completion_ids))[counted[i]:]
            entries = [self.model.entry(t, lp, top, params) for t, lp, top in
                       zip(tail, c.logprobs[counted[i]:], tops)]
            text = streams[i].rest(c.text)
            if text or tail:
                send(chunk([choice(i, {"content": text}, entries, list(tail))]))
            send(chunk([choice(i, {}, reason=c.finish_reason)]))
        if params.include_usage:
            from gaca_agent.serving.batcher import completion_usage

            send(chunk([], usage_=api.usage(*completion_usage(completions))))
        send("[DONE]")


def as_api_error(err: BaseException) -> APIError:
    """An error as the API answers it (a defect: a 500 naming it)."""
    if isinstance(err, APIError):
        return err
    return APIError(500, f"generation failed: {type(err).__name__}: {err}")
