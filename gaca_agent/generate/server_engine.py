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
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gaca_agent.generate.engines import Completion
from gaca_agent.generate.http import (MissingTokenIds, ServerRefused,  # noqa: F401
                                      ServerUnreachable, StaleWeights, WeightSyncError,
                                      post_json)
from gaca_agent.generate.spans import span_nlls
from gaca_agent.generate.versions import Expected, VersionWindow
from gaca_agent.generate.wire import (ServerKind, reported_versions, returned_ids,
                                      sampling_fields, token_starts_from_bytes, version_number)

class ServerEngine:
    """Chat requests to an inference server; see the module docstring."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, kind: ServerKind = "vllm",
                 api_key: str | None = None, concurrency: int = 64, timeout_s: float = 300.0,
                 retries: int = 3, backoff_s: float = 0.5, admin_api_key: str | None = None,
                 require_ids: bool = True, keep_versions: int = 1) -> None:
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
        self.window = VersionWindow(keep_versions)
        """The synced versions the server still serves (``keep_versions``: max_staleness
        + 1): adapters stay loaded side by side; full weights are one at a time."""
        self.labelled = False
        """Whether answers carry weight-version labels to check (after a full-weight sync,
        and on SGLang); vLLM's LoRA answers are checked by their adapter name."""
        self._busy, self._inflight, self._since = 0.0, 0, 0.0  # see busy_seconds
        self._lock = threading.Lock()

    def twin(self, base_url: str) -> "ServerEngine":
        """A client of the same model and settings for the server at ``base_url`` (one
        that replaces a lost one), knowing no synced version yet."""
        return ServerEngine(base_url, self.base_model, self.tokenizer, self.kind,
                            self.api_key, self.pool._max_workers, self.timeout_s,
                            self.retries, self.backoff_s, self.admin_api_key,
                            self.require_ids, self.window.keep)

    @property
    def weight_version(self) -> str | None:
        """The label of the newest synced weights the server reports (None: unchecked)."""
        return self.window.current if self.labelled else None

    @weight_version.setter
    def weight_version(self, label: str | None) -> None:
        if label is None:
            self.labelled = False
            return
        self.synced(version_number(label, len(self.window.versions)), label, labelled=True)

    def synced(self, version: int, name: str, labelled: bool | None = None) -> list[str]:
        """Record version ``version`` as served under ``name`` (an adapter's name or the
        weights' label); the names that fall out of the window."""
        with self._lock:
            if labelled is not None:
                self.labelled = labelled
            return self.window.add(version, name)

    # ------------------------------------------------------------- the model in use
    @property
    def model(self) -> str:
        """The ``model`` a request names now (and a vLLM response must name)."""
        return self._served(self.adapter)

    def _served(self, adapter: str | None) -> str:
        if adapter is None:
            return self.base_model
        return adapter if self.kind == "vllm" else f"{self.base_model}:{adapter}"

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

    def load_adapter(self, name: str, path: str, version: int | None = None) -> None:
        """Load a LoRA adapter under ``name`` (weight version ``version``, else read from
        the name) and roll out with it from now on; the adapters that fall out of the
        window (the last ``keep_versions``) are unloaded. On SGLang the server's weight
        version is set to ``name`` (its responses echo ``model``; the version is what it
        reports itself)."""
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
        number = version_number(name, len(self.window.versions)) if version is None \
            else version
        for dropped in self.synced(number, name, labelled=self.kind == "sglang"):
            self.unload_adapter(dropped)
        with self._lock:
            self.adapter = name

    def unload_adapter(self, name: str) -> None:
        try:
            self._admin("unload_lora_adapter", {"lora_name": name})
        except ServerRefused:
            pass  # already gone: nothing to free

    def update_weights_from_disk(self, path: str, version: str, number: int | None = None
                                 ) -> None:
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
            self.synced(version_number(version, len(self.window.versions)) if number is None
                        else number, version, labelled=True)
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

    @property
    def members(self) -> list["ServerEngine"]:
        """The servers a weight sync goes to and is probed on: this one
        (:class:`~gaca_agent.generate.server_group.ServerGroup` has several)."""
        return [self]

    def lose(self, engine, err: BaseException) -> bool:
        """Whether a sync can go on without ``engine``: not when it is the only server."""
        return False

    def submit(self, messages: list[dict], max_tokens: int, temperature: float,
               key: int | None = None, version: int | None = None,
               episode: Any = None) -> Future:
        """A future :class:`Completion` of one chat request; ``version``: the synced
        weight version the turn's episode is pinned to (None: the newest). The model and
        the versions the answer may come from are fixed here, at submission.
        ``episode``: the turn's episode (one server: nothing to route)."""
        with self._lock:
            target = self._target(version)
        return self.pool.submit(self._complete, messages, max_tokens, temperature, key,
                                *target)

    def complete(self, messages: list[dict], max_tokens: int, temperature: float,
                 key: int | None = None, version: int | None = None,
                 episode: Any = None) -> Completion:
        """One chat request, answered (see :meth:`submit`)."""
        with self._lock:
            target = self._target(version)
        return self._complete(messages, max_tokens, temperature, key, *target)

    def _target(self, version: int | None) -> tuple[str, Expected, int | None]:
        """(the model to name, what the answer may carry, the version when it is known
        from the model) of a turn pinned to ``version`` (None: the newest)."""
        if version is None or not self.window.window:
            adapter = self.adapter
        else:
            adapter = self.window.label_of(version) if self.adapter is not None else None
        if adapter is not None and not self.labelled:  # vLLM LoRA: the name says it
            return self._served(adapter), Expected(), self.window.versions.get(adapter)
        if adapter is not None:  # SGLang LoRA: one global label, the adapter pinned
            return (self._served(adapter), self.window.expect(None),
                    self.window.versions.get(adapter))
        if not self.labelled:
            return self.base_model, Expected(), None
        return self.base_model, self.window.expect(version), None

    def busy_seconds(self) -> float:
        """Seconds so far with at least one request of this engine in flight (the
        server's busy time as this client sees it)."""
        with self._lock:
            open_s = time.perf_counter() - self._since if self._inflight else 0.0
            return self._busy + open_s

    def _flight(self, delta: int) -> None:
        with self._lock:
            now = time.perf_counter()
            if self._inflight and delta < 0 and self._inflight + delta == 0:
                self._busy += now - self._since
            elif not self._inflight and delta > 0:
                self._since = now
            self._inflight += delta

    def _complete(self, messages: list[dict], max_tokens: int, temperature: float,
                  key: int | None, model: str, expected: Expected,
                  known: int | None) -> Completion:
        self._flight(+1)
        try:
            reply = post_json(f"{self.base_url}/chat/completions",
                              self.body(messages, max_tokens, temperature, key, model),
                              self.api_key, self.timeout_s, self.retries, self.backoff_s)
        finally:
            self._flight(-1)
        if not isinstance(reply, dict) or not reply.get("choices"):
            raise RuntimeError(f"{self.base_url} answered without choices: {str(reply)[:300]}")
        answered = self._check_weights(reply, model, expected)
        out = self._completion(reply, messages)
        out.policy_version = known if known is not None else answered
        return out

    def _check_weights(self, reply: dict, model: str, expected: Expected) -> int | None:
        """The version that answered (None when nothing says); StaleWeights when the
        answer is not from what the turn accepts."""
        stop = ("the server is not serving the weights this run synced; stopping rather "
                "than training on another policy's samples")
        if self.kind == "vllm" and reply.get("model") != model:
            raise StaleWeights(f"asked {self.base_url} for model {model!r}, the answer came "
                               f"from {reply.get('model')!r}: {stop}")
        if expected.pinned is None and expected.floor is None:
            return None
        versions = reported_versions(reply, self.kind)
        if versions is None:
            raise StaleWeights(f"{self.base_url} reported no weight version (this run "
                               f"synced {self.window.window}; vLLM >= 0.32 with return_weight_"
                               "versions, SGLang's metadata.weight_version)")
        return self.window.check(versions, expected, self.base_url)

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
