"""One streamed choice: tokens in as the engine samples them, text deltas out.

A delta is never taken back: text that could still become a stop string, and a trailing
partial character, are held until the next token settles them. The choice ends where
the engine's completion ends (:func:`gaca_agent.generate.engines.finish`): at EOS (kept as
a token, no text), at the token that completes the first stop string (text before it), or
after ``max_tokens`` tokens; so the streamed tokens and text add up to the completion.
"""

from __future__ import annotations

from typing import Sequence

from gaca_agent.generate.engines import first_stop


class ChoiceStream:
    def __init__(self, tokenizer, eos: set[int], stop: Sequence[str], max_tokens: int) -> None:
        self.tokenizer, self.eos, self.stop, self.max_tokens = tokenizer, eos, stop, max_tokens
        self.ids: list[int] = []
        self.sent = ""
        self.done = False

    def push(self, token_id: int) -> tuple[bool, str]:
        """(whether the token belongs to the choice, the text it releases)."""
        if self.done:
            return False, ""
        self.ids.append(token_id)
        if token_id in self.eos:
            self.done = True
            return True, ""
        self.done = len(self.ids) >= self.max_tokens
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        hit = first_stop(text, self.stop)
        if hit is not None:
            self.done = True
            ready = text[:hit[0]]
        elif self.done:
            ready = text
        else:
            ready = _settled(text, self.stop)
        if len(ready) <= len(self.sent) or not ready.startswith(self.sent):
            return True, ""
        delta, self.sent = ready[len(self.sent):], ready
        return True, delta

    def rest(self, final_text: str) -> str:
        """The text still to send once the completion is known."""
        if not final_text.startswith(self.sent):  # cannot happen with prefix-stable decoding
            raise RuntimeError(f"streamed text {self.sent!r} is not a prefix of the "
                               f"completion {final_text!r}")
        return final_text[len(self.sent):]


def _settled(text: str, stops: Sequence[str]) -> str:
    """``text`` without a trailing replacement character (half a UTF-8 character) and
    without the longest suffix that begins a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, end), hold, -1):
            if text[end - k:end] == stop[:k]:
                hold = k
                break
    return text[:end - hold]
