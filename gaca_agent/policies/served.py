"""The policy of the ``server`` rollout engine: prompts as chat messages, each turn one
request to the inference server (:class:`gaca_agent.generate.server_engine.ServerEngine`).

``submit(turn)`` returns a future answer, so the collector can send an episode's next
turn the moment its step returns (no lock-step rounds); ``act(turns)`` is the batch form.
A turn's sampling key travels as the request's ``seed``: through ``gaca-serve`` the turn
is sampled exactly as the local ``hf`` engine samples it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Sequence

from gaca_agent.policies.hf import to_output
from gaca_agent.generate.prompts import PromptBuilder
from gaca_agent.types import ActionOutput, Turn


class ServerPolicy:
    needs_expert = False

    def __init__(self, engine, temperature: float = 1.0, max_new_tokens: int = 128,
                 history_length: int = 2, template_file: str | None = None,
                 system_prompt: str | None = None) -> None:
        self.engine = engine
        self.temperature, self.max_new_tokens = float(temperature), int(max_new_tokens)
        self.prompts = PromptBuilder(history_length, template_file)
        self.system_prompt = system_prompt

    def messages(self, turn: Turn) -> list[dict]:
        return self.prompts.messages(turn, self.system_prompt)

    def submit(self, turn: Turn) -> Future:
        """A future :class:`ActionOutput` for one turn."""
        inner = self.engine.submit(self.messages(turn), self.max_new_tokens,
                                   self.temperature, turn.key, turn.version, turn.episode)
        outer: Future = Future()

        def done(f: Future) -> None:
            try:
                outer.set_result(to_output(f.result()))
            except BaseException as err:  # the collector re-raises it
                outer.set_exception(err)

        inner.add_done_callback(done)
        return outer

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        return [f.result() for f in [self.submit(t) for t in turns]]
