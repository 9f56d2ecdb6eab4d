"""What vLLM's and SGLang's chat answers say, read as data (pure functions): the sampled
token ids, the weight versions, where each token's text starts, and the sampling fields
every request states (see :mod:`gaca_agent.generate.server_engine`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

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


def version_number(label: str, default: int) -> int:
    """The version a label names (``RUN-vN`` -> N), else ``default``."""
    head, sep, tail = str(label).rpartition("-v")
    return int(tail) if sep and tail.isdigit() else default


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
