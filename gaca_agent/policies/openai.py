"""``openai:BASE_URL#MODEL``: any OpenAI-compatible chat-completions server.

``BASE_URL`` is the API root (``http://127.0.0.1:8000/v1``); the key comes from
``OPENAI_API_KEY`` when set. Generation kwargs have the local policies' names
(``temperature``, ``max_new_tokens``: sent as the API's ``max_tokens``). Requests run
concurrently (``concurrency``); one that never reached the server is retried with
exponential backoff, as are 429 and 5xx answers, and a server that stays unreachable
raises :class:`ServerUnreachable` naming the URL. A request the server took is never sent
again: a slow model (a CPU server can take minutes per batch) is waited for up to
``timeout_s`` (30 min by default), and every ``report_s`` seconds of waiting a line on
stderr says how many requests are unanswered and which step the oldest is.

Log-probs are asked for (``logprobs=True``, the default): the sampled tokens' log-probs
and the step's span NLLs (``response``, ``action``, ``think``, from the tokens' texts)
then come with each answer, as they do from a local model, so evaluation reports of a
served checkpoint carry NLLs. A server that refuses log-probs (a 400 naming them) is
asked without them from then on. Token ids are kept when the server returns them
(``token_ids=True`` asks for them: vLLM's and SGLang's ``return_token_ids``). For
training rollouts through a server see :mod:`gaca_agent.generate.server_engine`.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Sequence

from gaca_agent.generate.prompts import PromptBuilder, parse_response
from gaca_agent.generate.server_engine import (ServerRefused, ServerUnreachable,  # noqa: F401
                                       post_json, returned_ids, token_starts_from_bytes)
from gaca_agent.types import ActionOutput, Turn


class OpenAIPolicy:
    needs_expert = False

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 temperature: float = 1.0, max_new_tokens: int = 512,
                 timeout_s: float = 1800.0, retries: int = 3, backoff_s: float = 0.5,
                 concurrency: int = 8, report_s: float = 30.0,
                 history_length: int = 2, template_file: str | None = None,
                 system_prompt: str | None = None, logprobs: bool = True,
                 token_ids: bool = False) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key or os.environ.get("OPENAI_API_KEY")
        self.temperature, self.max_new_tokens = float(temperature), int(max_new_tokens)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.report_s = report_s
        self.concurrency = max(1, concurrency)
        self.prompts = PromptBuilder(history_length, template_file)
        self.system_prompt = system_prompt
        self.logprobs, self.token_ids = logprobs, token_ids

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(turns) or 1)) as pool:
            futures = [pool.submit(self._one, t) for t in turns]
            start = time.monotonic()
            while True:
                _, pending = wait(futures, timeout=self.report_s)
                if not pending:
                    return [f.result() for f in futures]
                oldest = next(t for t, f in zip(turns, futures) if f in pending)
                print(f"waiting on {self.url}: {len(pending)} of {len(turns)} requests "
                      f"unanswered after {time.monotonic() - start:.0f} s (the oldest: step "
                      f"{oldest.step} of {oldest.task[:60]!r})", file=sys.stderr, flush=True)

    def _one(self, turn: Turn) -> ActionOutput:
        body = {"model": self.model, "messages": self.prompts.messages(turn, self.system_prompt),
                "temperature": self.temperature,
                "max_tokens": self.max_new_tokens}
        if self.token_ids:
            body["return_token_ids"] = True
        if self.logprobs:
            try:
                reply = self._post({**body, "logprobs": True})
            except ServerRefused as err:
                if err.param not in ("logprobs", "top_logprobs"):
                    raise
                self.logprobs = False  # this server has none: ask without from now on
                reply = self._post(body)
        else:
            reply = self._post(body)
        return answer(reply)

    def _post(self, body: dict) -> dict:
        return post_json(self.url, body, self.api_key, self.timeout_s, self.retries,
                         self.backoff_s)


def answer(reply: dict) -> ActionOutput:
    """A policy's answer from a chat-completions reply: the text and parsed action, and,
    when the reply has them, the tokens' log-probs with the step's span NLLs and the
    token ids."""
    from gaca_agent.generate.spans import span_nlls

    choice = reply["choices"][0]
    text = choice["message"].get("content") or ""
    action, valid = parse_response(text)
    out = ActionOutput(text, action, valid, extra={"usage": reply.get("usage", {})})
    content = (choice.get("logprobs") or {}).get("content")
    if content:
        out.logprobs = [float(e["logprob"]) for e in content]
        out.nll = span_nlls(text, token_starts_from_bytes(content), out.logprobs)
    ids = returned_ids(reply)
    out.completion_ids, out.prompt_ids = ids.completion, ids.prompt
    return out
