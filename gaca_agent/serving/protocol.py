"""The chat-completions API as ``gaca-serve`` speaks it: request checks and response shapes.

A request is checked in full before it is queued. A parameter the server does not
implement is refused with a 400 in OpenAI's error format naming it (``param``), never
ignored; a known parameter with a neutral value (``frequency_penalty: 0``, an empty
``logit_bias``, ``null``) is accepted. Supported: ``model``, ``messages`` (roles
``system``, ``developer``, ``user``, ``assistant``; text content, as a string or as text
parts), ``stream`` and ``stream_options.include_usage``, ``n``, ``logprobs`` and
``top_logprobs``, ``stop``, ``seed``, ``max_tokens`` and ``max_completion_tokens``,
``temperature``, ``top_p``, ``user``; vLLM's extras ``return_token_ids`` (prompt and
completion token ids in the response), ``return_tokens_as_token_ids`` (log-prob tokens
written ``token_id:ID``) and ``return_weight_versions`` (the weight label per token span);
and the sampling extras of vLLM and SGLang at their neutral values only (``top_k`` 0 or
-1, ``min_p`` 0, ``repetition_penalty`` 1): gaca-serve samples the plain softmax.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

ROLES = ("system", "developer", "user", "assistant")
SUPPORTED = ("model", "messages", "stream", "stream_options", "n", "logprobs", "top_logprobs",
             "stop", "seed", "max_tokens", "max_completion_tokens", "temperature", "top_p",
             "user", "return_token_ids", "return_tokens_as_token_ids",
             "return_weight_versions")
NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
           "store": (False,), "metadata": ({},), "top_k": (0, -1), "min_p": (0, 0.0),
           "repetition_penalty": (1, 1.0)}
"""Known parameters accepted only with the value that changes nothing."""
MAX_N = 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An error answered in OpenAI's format: ``{"error": {message, type, param, code}}``."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error",
             404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error",
             500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status,
                                                                          "server_error"),
                          "param": self.param, "code": self.code}}


def unsupported(name: str) -> APIError:
    return APIError(400, f"gaca-serve does not support the parameter {name!r}; leave it out "
                         f"(supported: {', '.join(SUPPORTED)})", name, "unsupported_parameter")


@dataclass(frozen=True)
class ChatParams:
    """A checked chat-completions request."""

    model: str
    messages: tuple[dict, ...]
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    weight_versions: bool = False


def parse_chat(body: Any) -> ChatParams:
    """A :class:`ChatParams` from a request body, or :class:`APIError` (400) saying what is
    wrong and naming the parameter."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, value in body.items():
        if value is None or name in SUPPORTED:
            continue
        if name in NEUTRAL and any(value == v and type(value) is type(v)
                                   for v in NEUTRAL[name]):
            continue
        raise unsupported(name)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required (a name from GET /v1/models)", "model")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None \
            and body["max_tokens"] != body["max_completion_tokens"]:
        raise APIError(400, "give max_tokens or max_completion_tokens, not two different "
                            "values", "max_tokens")
    max_tokens = _integer(body, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, None)
    logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise APIError(400, "stream_options needs stream: true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise APIError(400, "stream_options supports include_usage only", "stream_options")
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p <= 0:
        raise APIError(400, "top_p must be in (0, 1]", "top_p")
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int or not -2 ** 63 <= seed < 2 ** 63):
        raise APIError(400, "seed must be a 64-bit signed integer", "seed")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, "user must be a string", "user")
    return ChatParams(
        model=model, messages=_messages(body.get("messages")), stream=stream,
        include_usage=bool((options or {}).get("include_usage")),
        n=_integer(body, "n", 1, MAX_N) or 1, logprobs=logprobs, top_logprobs=top,
        stop=_stops(body.get("stop")), seed=seed, max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        return_token_ids=_boolean(body, "return_token_ids"),
        tokens_as_ids=_boolean(body, "return_tokens_as_token_ids"),
        weight_versions=_boolean(body, "return_weight_versions"))


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false", name)
    return value


def _integer(body: dict, name: str, lo: int, hi: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise APIError(400, f"{name} must be an integer {bound}, got {value!r}", name)
    return value


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not lo <= value <= hi:
        raise APIError(400, f"{name} must be a number between {lo:g} and {hi:g}, "
                            f"got {value!r}", name)
    return float(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop takes at most {MAX_STOP} strings", "stop")
    return tuple(s for s in stops if s)


def _messages(value: Any) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise APIError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise APIError(400, f"{where}.role {role!r} is not supported (roles: "
                                f"{', '.join(ROLES)}; no tool calling)", f"{where}.role")
        for key, item in message.items():
            if key not in ("role", "content", "name") and item is not None:
                raise APIError(400, f"{where}.{key} is not supported", f"{where}.{key}")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(message.get("content"), where)})
    return tuple(out)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(400, f"{where}.content: only text parts are supported, got "
                                    f"{kind!r}", f"{where}.content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError(400, f"{where}.content must be a string or a list of text parts",
                   f"{where}.content")


# ---------------------------------------------------------------- responses
def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def token_entry(token: tuple[str, list[int]], logprob: float,
                top: Sequence[tuple[tuple[str, list[int]], float]] = ()) -> dict:
    """One element of ``logprobs.content`` from (text, bytes) pairs."""
    return {"token": token[0], "logprob": logprob, "bytes": token[1],
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for (t, b), lp in top]}


def byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's): the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer, token_id: int, byte_level: dict[str, int] | None) -> list[int]:
    """A token's own bytes (half a character stays half), for byte-level tokenizers;
    otherwise the UTF-8 of its decoded text."""
    if byte_level is not None:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and all(c in byte_level for c in piece):
            return [byte_level[c] for c in piece]
    return list(tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8"))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(id_: str, created: int, model: str, choices: list[dict],
          usage_: dict | None = None, include_usage: bool = False, **extra: Any) -> dict:
    """One ``chat.completion.chunk`` (``usage`` is present, as null until the last chunk,
    when the client asked for it)."""
    out = {"id": id_, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": choices, **extra}
    if include_usage:
        out["usage"] = usage_
    return out
