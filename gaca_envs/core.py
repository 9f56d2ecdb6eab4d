"""The text-environment contract shared by every ``gaca/`` environment.

:class:`TextEnv` owns what is the same everywhere: ``Text`` spaces whose charset accepts
real observations, the ``info`` keys of the public contract (``admissible_actions``,
``state_key``, ``task``, ``task_id``, ``won``, ``action_valid``), action normalisation, and
the rule that an action which is not admissible is a no-op that never raises. A concrete
environment is only a simulator adapter: it implements the four ``_sim_*`` hooks.
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: Every printable ASCII character plus the whitespace real observations contain.
TEXT_CHARSET: str = string.printable
#: Observations longer than this are cut (with a marker) so the space always contains them.
MAX_OBSERVATION_CHARS: int = 1 << 16
#: Longest action text the action space samples; longer actions are accepted (and invalid).
MAX_ACTION_CHARS: int = 1 << 10

_CHARSET_SET = frozenset(TEXT_CHARSET)
#: ``state``: the simulator's canonical state key; ``observation``: a hash of the observation
#: text (GiGPO's anchor, kept for comparison).
Anchor = Literal["state", "observation"]
_INVALID_FEEDBACK = "Nothing happens."


def stable_hash(parts: Iterable[str]) -> str:
    """A process-independent hex digest of a sequence of strings (never Python's salted hash).

    The parts are length-prefixed so that ``["ab", "c"]`` and ``["a", "bc"]`` differ.
    """
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return h.hexdigest()


def normalize_action(action: Any) -> str:
    """Lower-case, whitespace-collapsed action text; non-strings become ``""``."""
    if not isinstance(action, str):
        return ""
    return " ".join(action.split()).lower()


def to_charset(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """Return ``text`` inside :data:`TEXT_CHARSET` and ``limit`` characters.

    Accented letters lose their accents (NFKD); any other character outside the charset
    becomes ``?``. Pure-ASCII text (the usual case) is returned unchanged.
    """
    if not (text.isascii() and all(c in _CHARSET_SET for c in text)):
        text = unicodedata.normalize("NFKD", text)
        text = "".join(c if c in _CHARSET_SET else ("" if unicodedata.combining(c) else "?")
                       for c in text)
    if len(text) > limit:
        marker = "\n[... truncated]"
        text = text[: limit - len(marker)] + marker
    return text


@dataclass(frozen=True)
class SimStep:
    """What a simulator adapter reports after a reset or an admissible action."""

    observation: str
    admissible_actions: tuple[str, ...]
    state_key: str
    reward: float = 0.0
    terminated: bool = False
    won: bool = False
    extra_info: dict[str, Any] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """Base class of every ``gaca/`` environment: text in, text out.

    Subclasses implement:

    - ``num_tasks`` (property) and ``_sim_task(task_id) -> str`` (the instruction);
    - ``_sim_reset(task_id) -> SimStep``: start task ``task_id`` (fully determined by it);
    - ``_sim_step(action) -> SimStep``: apply an *admissible* action (already normalised).

    ``anchor="observation"`` replaces the canonical key by a hash of the observation text.
    Invalid actions never reach the simulator: they return the previous observation's
    admissible actions and state key, reward 0 and ``action_valid=False``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, render_mode: str | None = None, anchor: Anchor = "state") -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if anchor not in ("state", "observation"):
            raise ValueError(f"anchor must be 'state' or 'observation', got {anchor!r}")
        self.render_mode = render_mode
        self.anchor = anchor
        self.observation_space = spaces.Text(MAX_OBSERVATION_CHARS, min_length=0,
                                             charset=TEXT_CHARSET)
        self.action_space = spaces.Text(MAX_ACTION_CHARS, min_length=0, charset=TEXT_CHARSET)
        self._task_id: int | None = None
        self._last: SimStep | None = None
        self._won = False

    # ----------------------------------------------------------------- hooks
    @property
    def num_tasks(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_task(self, task_id: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_reset(self, task_id: int) -> SimStep:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_step(self, action: str) -> SimStep:  # pragma: no cover - abstract
        raise NotImplementedError

    def _is_valid(self, action: str) -> bool:
        """Whether a normalised action is admissible now (parametric envs override)."""
        assert self._last is not None
        return action in self._last.admissible_actions

    # ----------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._task_id = self._choose_task(options)
        self._won = False
        self._last = self._sim_reset(self._task_id)
        return self._emit(self._last, action_valid=True)

    def step(self, action: str):
        if self._last is None:
            raise RuntimeError("call reset() before step()")
        text = normalize_action(action)
        if not self._is_valid(text):
            invalid = SimStep(_INVALID_FEEDBACK, self._last.admissible_actions,
                              self._last.state_key, won=self._won)
            obs, info = self._emit(invalid, action_valid=False)
            return obs, 0.0, False, False, info
        self._last = self._sim_step(text)
        self._won = self._won or self._last.won
        obs, info = self._emit(self._last, action_valid=True)
        return obs, float(self._last.reward), bool(self._last.terminated), False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi" and self._last is not None:
            return self._last.observation
        return None

    # ----------------------------------------------------------------- helpers
    @property
    def task_id(self) -> int | None:
        """The task of the current episode (``None`` before the first reset)."""
        return self._task_id

    def _choose_task(self, options: dict[str, Any] | None) -> int:
        n = self.num_tasks
        if n <= 0:
            raise RuntimeError(f"{type(self).__name__} has no tasks to play")
        options = dict(options or {})
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; valid: ['task_id']")
        if "task_id" in options and options["task_id"] is not None:
            k = options["task_id"]
            if not isinstance(k, (int, np.integer)) or not 0 <= int(k) < n:
                raise ValueError(f"task_id must be an int in range({n}), got {k!r}")
            return int(k)
        return int(self.np_random.integers(n))

    def _emit(self, sim: SimStep, *, action_valid: bool) -> tuple[str, dict[str, Any]]:
        assert self._task_id is not None
        obs = to_charset(sim.observation)
        key = sim.state_key if self.anchor == "state" else stable_hash(["observation", obs])
        info = {
            "admissible_actions": tuple(sim.admissible_actions),
            "state_key": key,
            "task": self._sim_task(self._task_id),
            "task_id": self._task_id,
            "won": bool(self._won or sim.won),
            "action_valid": action_valid,
        }
        info.update(sim.extra_info)
        return obs, info

