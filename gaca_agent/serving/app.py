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

import os
import secrets
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from gaca_agent.serving import protocol as api
from gaca_agent.serving.handler import REQUEST_TIMEOUT_S, Handler
from gaca_agent.serving.protocol import APIError
from gaca_envs.net import QuietHangUps


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
        from gaca_agent.serving.receiver import Receiver
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
        self.batcher = Batcher(self.engine, self.adapters, max_queue, max_batch,
                               running=self.weights.running,
                               label=lambda: self.weights.version)
        self.receiver = Receiver(self.weights, self.device)
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


class ChatServer(QuietHangUps, ThreadingHTTPServer):
    """The threaded HTTP server of one :class:`ChatModel` (requests: :class:`Handler`)."""

    daemon_threads = True
    # the accept backlog: socketserver's default of 5 reset about 6% of the connections of
    # 64 clients each opening a connection per request (the 10-minute soak)
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], model: ChatModel,
                 api_key: str | None, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.model, self.api_key = model, api_key
        self.request_timeout_s = request_timeout_s
        super().__init__(address, Handler)


def make_server(model: ChatModel, host: str = "127.0.0.1", port: int = 0,
                api_key: str | None = None,
                request_timeout_s: float = REQUEST_TIMEOUT_S) -> ChatServer:
    """A threaded HTTP server for ``model``; loopback only unless an API key is set."""
    from gaca_envs.net import is_loopback

    if not is_loopback(host) and not api_key:
        raise ValueError(f"refusing to serve on {host!r} without an API key: pass --api-key "
                         "(clients send it as a Bearer token) or bind 127.0.0.1")
    return ChatServer((host, port), model, api_key, request_timeout_s)


def sampling_key(seed: int | None, choice: int) -> int:
    """The engine key of a choice: choice 0 of a request with ``seed`` s samples with key
    s itself, exactly as the trainer's ``hf`` engine samples a turn whose key is s (so a
    rollout through the server equals a local one); choice i > 0 with row_key(s, i);
    without a seed, a random key."""
    from gaca_agent.generate.sampling import row_key

    if seed is None:
        return secrets.randbits(63)
    return seed if choice == 0 else row_key(seed, choice)
