"""Records exchanged between environments, policies and the collector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Turn:
    """What a policy sees for one live environment at one step.

    ``history`` holds the previous (observation, action) pairs of the episode, oldest
    first; the prompt builder decides how many to show. ``expert_action`` is filled only
    for policies that ask for it (``Policy.needs_expert``). ``key`` is the turn's
    sampling key (from the episode's seed, its place in the task group and the step;
    ``None`` for unseeded episodes): a stochastic policy draws this turn's randomness from
    it alone, so that an episode plays the same way in any batch, fresh or resumed.
    """

    env_id: str
    task: str
    observation: str
    admissible_actions: tuple[str, ...]
    history: tuple[tuple[str, str], ...] = ()
    step: int = 0
    expert_action: str | None = None
    family: str = "generic"
    key: int | None = None
    version: int | None = None
    """The synced weight version the episode is pinned to (asynchronous training with an
    inference server; None: the newest)."""
    episode: Any = None
    """An id of the turn's episode within its collection (several inference servers keep
    an episode's turns on one server)."""


@dataclass
class ActionOutput:
    """A policy's answer for one turn.

    ``text`` is the raw response, ``action`` the parsed action sent to the environment,
    ``format_valid`` whether the response had a parsable action. Trainable policies also
    fill token ids, the per-token log-probabilities of the sampled completion and ``nll``,
    the step's mean NLL over each span (``response``, ``action``, ``think``), computed by
    the engine that sampled the tokens.
    """

    text: str
    action: str
    format_valid: bool = True
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    nll: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
