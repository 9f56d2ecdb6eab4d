"""The ``server`` rollout engine: turns sampled by an inference server (vLLM, SGLang, or
``gaca-serve``) over the OpenAI chat API, with exact token ids and weight sync.

Checked against vLLM 0.33.0 and SGLang 0.5.23 (their own request, response, LoRA and
auth code; tests/test_upstream_servers.py). Each turn is its own request (``submit``
returns a future; the collector sends an episode's next turn as soon as its environment
step returns). A request states **every** sampling parameter the learner assumes
(:func:`sampling_fields`): temperature, top_p 1 and neutral top_k, min_p and repetition,
presence and frequency penalties. Left out, both servers fill them from the model's
``generation_config.json`` (for Qwen2.5-Instruct top_k 20, top_p 0.8, repetition 1.05),
and the rollouts would come from another distribution than the one trained on. The turn's
sampling key travels as ``seed`` (vLLM honours it; SGLang only when started with
``--enable-deterministic-inference``).

Token ids, as each server returns them for ``return_token_ids: true``:

- **vLLM**: ``prompt_token_ids`` at the top of the response, ``choices[].token_ids``.
- **SGLang**: ``choices[].prompt_token_ids`` and ``choices[].response_token_ids`` (its
  name since 2026-08; ``token_ids`` before), or ``sglext.input_ids`` / ``output_ids``.
- ``gaca-serve`` answers in vLLM's form.

The ids are used as returned. A response without them stops training
(:class:`MissingTokenIds`): re-tokenizing the text gives other tokens than the sampled
ones. (``require_ids=False`` re-tokenizes instead and flags the step
``token_source: retokenized``, for uses that do not train.)

Which weights answered: vLLM names the served model or adapter it resolved in ``model``;
after a full-weight sync it also labels its weights (``/update_weight_version``) and
reports the label per output token (``return_weight_versions``). SGLang echoes the
requested ``model`` whatever it serves, so it is checked by the weight version the server
reports (``metadata.weight_version``), which the engine sets after every sync. A response
from other weights stops the run (:class:`StaleWeights`).

Weight sync, LoRA (:meth:`ServerEngine.load_adapter`): vLLM ``POST /v1/load_lora_adapter``
(``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), requests then name the
adapter as ``model``; SGLang ``POST /load_lora_adapter`` (``--enable-lora``), requests
name ``BASE:ADAPTER``. Full weights (:meth:`ServerEngine.update_weights_from_disk`, a
folder of safetensors the server can read): vLLM ``/pause``, ``/collective_rpc``
``reload_weights``, ``/update_weight_version``, ``/resume`` (``VLLM_SERVER_DEV_MODE=1``);
SGLang ``/update_weights_from_disk``. SGLang's weight endpoints take its
``--admin-api-key`` when set (``admin_api_key``). A failed load raises
:class:`WeightSyncError` with the server's own message; HTTP errors of weight loads are
never retried (only connection failures are).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from gaca_agent.generate.engines import Completion
from gaca_agent.generate.http import (MissingTokenIds, ServerRefused,  # noqa: F401
                                      ServerUnreachable, StaleWeights, WeightSyncError,
                                      post_json)
from gaca_agent.generate.spans import span_nlls

ServerKind = Literal["vllm", "sglang"]

NEUTRAL_TOP_K = {"vllm": 0, "sglang": -1}
"""The top_k value that disables top-k sampling (vLLM: 0 or -1; SGLang: -1)."""


def sampling_fields(kind: ServerKind, temperature: float) -> dict[str, float]:
    """Every sampling parameter of a request: the plain softmax at ``temperature`` that
    the learner's log-probs assume, nothing left for the server to fill in."""
    return {"temperature": float(temperature), "top_p": 1.0, "top_k": NEUTRAL_TOP_K[kind],
            "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0}


def token_starts_from_bytes(content: Sequence[dict]) -> list[int]:
    """Where each token's text begins, from ``logprobs.content``'s bytes (a character
    split over two tokens starts at the first)."""
    starts, done = [], b""
    for entry in content:
        starts.append(len(done.decode("utf-8", errors="ignore")))
        piece = entry.get("bytes")
        done += bytes(piece) if piece is not None else entry["token"].encode("utf-8")
    return starts


@dataclass(frozen=True)
class TokenIds:
    prompt: list[int] | None
    completion: list[int] | None


def returned_ids(reply: dict, index: int = 0) -> TokenIds:
    """The token ids a response carries, in vLLM's or SGLang's form (None where absent):
    prompt from ``prompt_token_ids`` (top level: vLLM; the choice: SGLang) or
    ``sglext.input_ids``; completion from ``token_ids`` (vLLM; SGLang before 2026-08),
    ``response_token_ids`` (SGLang) or ``sglext.output_ids``."""
    choice = reply["choices"][index]
    ext = reply.get("sglext") or {}
    prompt = reply.get("prompt_token_ids") or choice.get("prompt_token_ids") \
        or ext.get("input_ids")
    completion = choice.get("token_ids")
    if completion is None:
        completion = choice.get("response_token_ids")
    if completion is None and ext.get("output_ids") is not None:
        completion = ext["output_ids"][index]
    return TokenIds(list(prompt) if prompt is not None else None,
                    list(completion) if completion is not None else None)


def reported_versions(reply: dict, kind: ServerKind) -> set[str] | None:
    """The weight versions a response says it was sampled with (None: it says nothing):
    vLLM's per-token ``choices[].weight_versions`` spans, SGLang's
    ``metadata.weight_version``."""
    if kind == "sglang":
        version = (reply.get("metadata") or {}).get("weight_version")
        return None if version is None else {str(version)}
    spans = [s for c in reply["choices"] for s in (c.get("weight_versions") or [])]
    if not spans:
        return None
    return {str(s["version"] if isinstance(s, dict) else s[0]) for s in spans}


class ServerEngine:
    """Chat requests to an inference server; see the module docstring."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, kind: ServerKind = "vllm",
                 api_key: str | None = None, concurrency: int = 64, timeout_s: float = 300.0,
                 retries: int = 3, backoff_s: float = 0.5, admin_api_key: str | None = None,
                 require_ids: bool = True) -> None:
        if kind not in ("vllm", "sglang"):
            raise ValueError(f"server kind must be vllm or sglang, got {kind!r}")
        self.base_url, self.base_model, self.kind = base_url.rstrip("/"), model, kind
        self.tokenizer = tokenizer
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY")
        self.admin_api_key = admin_api_key or self.api_key
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.require_ids = require_ids
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency),
                                       thread_name_prefix="gaca-server-engine")
        self.adapter: str | None = None
        self.weight_version: str | None = None
        """The label the server reports for the synced weights; None before a sync that
        sets one (every response must then carry it)."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------- the model in use
    @property
    def model(self) -> str:
        """The ``model`` every request names (and every vLLM response must name)."""
        if self.adapter is None:
            return self.base_model
        return self.adapter if self.kind == "vllm" else f"{self.base_model}:{self.adapter}"

    def _root(self) -> str:
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    def _admin_url(self, endpoint: str) -> str:
        """vLLM's LoRA endpoints sit under ``/v1``; its weight endpoints and all of
        SGLang's at the root."""
        if self.kind == "vllm" and endpoint.endswith("lora_adapter"):
            return f"{self._root()}/v1/{endpoint}"
        return f"{self._root()}/{endpoint}"

    def _admin(self, endpoint: str, body: dict | None = None) -> Any:
        """A weight call: connection failures are retried, HTTP errors never; an answer
        that says ``success: false`` (SGLang's form) is a refusal too."""
        url = self._admin_url(endpoint)
        reply = post_json(url, body, self.admin_api_key, self.timeout_s, self.retries,
                          self.backoff_s, retry_http=False)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise ServerRefused(f"{url} answered {json.dumps(reply)[:1000]}", 400, None)
        return reply

    def _set_version(self, version: str) -> None:
        self._admin("update_weight_version", {"new_version": version} if self.kind == "vllm"
                    else {"new_version": version, "abort_all_requests": False})
        with self._lock:
            self.weight_version = version

    def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter under ``name`` and roll out with it from now on; the one
        used before is unloaded. On SGLang the server's weight version is set to ``name``
        (its responses echo ``model``; the version is what it reports itself)."""
        try:
            self._admin("load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            if self.kind == "sglang":
                self._set_version(name)
        except (ServerRefused, ServerUnreachable) as err:
            raise WeightSyncError(f"the server did not load adapter {name!r} from {path}: "
                                  f"{err}. vLLM needs --enable-lora --max-lora-rank R (at "
                                  "least learner.lora_r) and VLLM_ALLOW_RUNTIME_LORA_UPDATING="
                                  "True; SGLang --enable-lora --max-lora-rank R "
                                  "--lora-target-modules ... (and server.admin_api_key_env "
                                  "when it runs with --admin-api-key)") from err
        with self._lock:
            previous, self.adapter = self.adapter, name
        if previous is not None and previous != name:
            self.unload_adapter(previous)

    def unload_adapter(self, name: str) -> None:
        try:
            self._admin("unload_lora_adapter", {"lora_name": name})
        except ServerRefused:
            pass  # already gone: nothing to free

    def update_weights_from_disk(self, path: str, version: str) -> None:
        """Make the server serve the full weights saved in ``path`` (safetensors and
        config, readable by the server), labelled ``version``; rollouts then check that
        label. vLLM (``VLLM_SERVER_DEV_MODE=1``): pause (waiting for requests in flight),
        ``reload_weights`` over ``/collective_rpc``, label, resume. SGLang:
        ``/update_weights_from_disk`` with the label."""
        try:
            if self.kind == "vllm":
                self._admin("pause?mode=wait")
                try:
                    self._admin("collective_rpc", {"method": "reload_weights",
                                                   "kwargs": {"weights_path": str(path)}})
                    self._set_version(version)
                finally:
                    self._admin("resume")
            else:
                self._admin("update_weights_from_disk",
                            {"model_path": str(path), "weight_version": version,
                             "flush_cache": True})
                with self._lock:
                    self.weight_version = version
        except (ServerRefused, ServerUnreachable) as err:
            hint = ("start vLLM with VLLM_SERVER_DEV_MODE=1 (its weight endpoints) on a "
                    "file system where it can read the run's weights/ folder"
                    if self.kind == "vllm" else
                    "SGLang must read the run's weights/ folder (and server.admin_api_key_env"
                    " when it runs with --admin-api-key)")
            raise WeightSyncError(f"the server did not load the weights in {path}: {err}. "
                                  f"{hint}") from err

    # ------------------------------------------------------------- generation
    def body(self, messages: list[dict], max_tokens: int, temperature: float,
             key: int | None, model: str) -> dict:
        """The request body of one turn."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens,
                **sampling_fields(self.kind, temperature), "logprobs": True,
                "return_token_ids": True}
        if self.kind == "vllm" and self.weight_version is not None:
            body["return_weight_versions"] = True
        if key is not None:
            body["seed"] = int(key)
        return body

    def submit(self, messages: list[dict], max_tokens: int, temperature: float,
               key: int | None = None) -> Future:
        """A future :class:`Completion` of one chat request."""
        model = self.model  # fixed at submission: a sync in between cannot mix weights
        return self.pool.submit(self.complete, messages, max_tokens, temperature, key, model)

    def complete(self, messages: list[dict], max_tokens: int, temperature: float,
                 key: int | None = None, model: str | None = None) -> Completion:
        model = model or self.model
        expected = self.weight_version
        reply = post_json(f"{self.base_url}/chat/completions",
                          self.body(messages, max_tokens, temperature, key, model),
                          self.api_key, self.timeout_s, self.retries, self.backoff_s)
        if not isinstance(reply, dict) or not reply.get("choices"):
            raise RuntimeError(f"{self.base_url} answered without choices: {str(reply)[:300]}")
        self._check_weights(reply, model, expected)
        return self._completion(reply, messages)

    def _check_weights(self, reply: dict, model: str, expected: str | None) -> None:
        stop = ("the server is not serving the weights this run synced; stopping rather "
                "than training on another policy's samples")
        if self.kind == "vllm" and reply.get("model") != model:
            raise StaleWeights(f"asked {self.base_url} for model {model!r}, the answer came "
                               f"from {reply.get('model')!r}: {stop}")
        if expected is None:
            return
        versions = reported_versions(reply, self.kind)
        if versions is None:
            raise StaleWeights(f"{self.base_url} reported no weight version (this run "
                               f"synced {expected!r}; vLLM >= 0.32 with return_weight_"
                               "versions, SGLang's metadata.weight_version)")
        if versions != {expected}:
            raise StaleWeights(f"{self.base_url} answered with weight version "
                               f"{sorted(versions)}, this run synced {expected!r}: {stop}")

    def _completion(self, reply: dict, messages: list[dict]) -> Completion:
        choice = reply["choices"][0]
        text = choice["message"].get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(e["logprob"]) for e in content]
        ids = returned_ids(reply)
        source = "server"
        prompt, completion = ids.prompt, ids.completion
        if prompt is None or completion is None:
            if self.require_ids:
                raise MissingTokenIds(
                    f"{self.base_url} returned no "
                    f"{'prompt' if prompt is None else 'completion'} token ids for "
                    "return_token_ids: true (vLLM: prompt_token_ids and choices[].token_ids "
                    "since 0.10.2; SGLang: choices[].prompt_token_ids and "
                    "response_token_ids). Training needs the sampled ids: re-tokenizing the "
                    "text gives other tokens. Upgrade the server")
            source = "retokenized"
            if prompt is None:
                chat = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                          add_generation_prompt=True)
                prompt = self.tokenizer(chat, add_special_tokens=False)["input_ids"]
            if completion is None:
                completion = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                if choice.get("finish_reason") == "stop" and self.tokenizer.eos_token_id \
                        is not None:
                    completion = [*completion, self.tokenizer.eos_token_id]
        if len(logprobs) != len(completion):
            if source == "server":
                raise MissingTokenIds(f"{self.base_url} returned {len(completion)} token ids "
                                      f"and {len(logprobs)} log-probs for one completion")
            logprobs = (logprobs + [float("nan")] * len(completion))[:len(completion)]
        nll = span_nlls(text, token_starts_from_bytes(content),
                        [float(e["logprob"]) for e in content])
        return Completion(list(prompt), list(completion), logprobs, text,
                          "stop" if choice.get("finish_reason") == "stop" else "length", nll,
                          token_source=source, model=reply.get("model"))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
