"""A step's NLL over a span of its response, from the engine's own token boundaries.

GACA's criticality signal is the mean negative log-likelihood of a step's response
(``response``), of the tokens inside ``<action>...</action>`` (``action``) or of those
inside ``<think>...</think>`` (``think``). The engine that sampled the tokens knows where
each token's text starts; :func:`span_nlls` turns that into the three NLLs. A span whose
tags are absent, or that holds no token, falls back to the whole response.
"""

from __future__ import annotations

import re
from typing import Literal, Sequence

import numpy as np

NllSpan = Literal["response", "action", "think"]
SPANS: tuple[str, ...] = ("response", "action", "think")
_SPAN_RE = {"action": re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE),
            "think": re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)}


def token_starts(tokenizer, ids: Sequence[int], text: str) -> list[int]:
    """Character offset in ``text`` (the decoded ``ids``) where each token begins.

    Decoding token by token is exact when the pieces add up to ``text``; otherwise
    (tokens that split a multi-byte character, tokenizers that drop a leading space when
    decoding alone) each offset is the length of the decoded prefix.
    """
    pieces = tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=False)
    if "".join(pieces) == text:
        starts, pos = [], 0
        for piece in pieces:
            starts.append(pos)
            pos += len(piece)
        return starts
    return [len(tokenizer.decode(list(ids[:i]), skip_special_tokens=False))
            for i in range(len(ids))]


def span_nlls(text: str, starts: Sequence[int], logprobs: Sequence[float]) -> dict[str, float]:
    """Mean NLL of the response's tokens, and of those inside the action and think tags."""
    if not len(logprobs):
        return dict.fromkeys(SPANS, 0.0)
    lp = np.asarray(logprobs, dtype=np.float64)
    whole = float(-lp.mean())
    out = {"response": whole}
    pos = np.asarray(starts[: len(lp)])
    for name, pattern in _SPAN_RE.items():
        match = pattern.search(text)
        inside = ((pos >= match.start(1)) & (pos < match.end(1))) if match else None
        out[name] = float(-lp[inside].mean()) if inside is not None and inside.any() else whole
    return out
