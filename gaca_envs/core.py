"""The text-environment contract shared by every ``gaca/`` environment.

:class:`TextEnv` owns what is the same everywhere: ``Text`` spaces whose charset accepts
real observations, the ``info`` keys of the public contract (``admissible_actions``,
``state_key``, ``task``, ``task_id``, ``won``, ``action_valid``), action normalisation, the
rule that an action which is not admissible is a no-op that never raises, and what a step
after the end of an episode does. A concrete environment is only a simulator adapter: it
implements the four ``_sim_*`` hooks.

What the agent is shown is what it can type: observations and admissible actions pass
through :func:`to_charset` (printable ASCII), and an admissible action is accepted in its
shown form as well as in the simulator's own spelling (``crème`` is shown and accepted as
``creme``).

Observation spaces are :class:`TextSpace`, a ``gymnasium.spaces.Text`` whose shared-memory
transport works: gymnasium's own ``AsyncVectorEnv`` (``shared_memory=True``, its default)
decodes a ``Text`` observation once, when the vector env is built, and returns that stale
value (64 KiB of ``'0'``) on every later step. ``TextSpace`` registers its own
shared-memory reader, which decodes the buffer each time it is read.
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import (create_shared_memory, read_from_shared_memory,
                                    write_to_shared_memory)

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


#: ASCII spellings of the punctuation and symbols product and game texts use.
_ASCII_SPELLING = str.maketrans({
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\ufe58\ufe63\uff0d", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb", '"'),
    **dict.fromkeys("\u2022\u00b7\u2027\u2219\u25cf\u25e6", "*"),
    **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff\u00ad", ""),
    "\u2044": "/", "\u00d7": "x", "\u00f7": "/", "\u00b1": "+/-", "\u00b0": " deg",
    "\u20ac": "EUR", "\u00a3": "GBP", "\u00a5": "JPY", "\u00a2": "c", "\u00a9": "(c)",
    "\u00ae": "(R)", "\u2192": "->", "\u2190": "<-", "\u2264": "<=", "\u2265": ">=",
    "\u2248": "~", "\u2260": "!=", "\u2026": "...", "\u00bf": "?", "\u00a1": "!",
    "\u00df": "ss", "\u00e6": "ae", "\u00c6": "AE", "\u0153": "oe", "\u0152": "OE",
    "\u00f8": "o", "\u00d8": "O", "\u0142": "l", "\u0141": "L", "\u00f0": "d",
    "\u00fe": "th", "\u203a": ">", "\u2039": "<",
})


def to_charset(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """Return ``text`` inside :data:`TEXT_CHARSET` and ``limit`` characters.

    Punctuation and symbols take their usual ASCII spelling (``–`` and ``—`` become
    ``-``, curly quotes straight ones, ``€`` ``EUR``; :data:`_ASCII_SPELLING`), accented
    letters lose their accents and compatibility forms decompose (NFKD: ``™`` is ``TM``);
    any other character outside the charset becomes ``?``. Pure-ASCII text (the usual
    case) is returned unchanged.
    """
    if not (text.isascii() and all(c in _CHARSET_SET for c in text)):
        text = unicodedata.normalize("NFKD", text).translate(_ASCII_SPELLING)
        text = "".join(c if c in _CHARSET_SET else ("" if unicodedata.combining(c) else "?")
                       for c in text)
    if len(text) > limit:
        marker = "\n[... truncated]"
        text = text[: limit - len(marker)] + marker
    return text


class TextSpace(spaces.Text):
    """``spaces.Text`` whose values travel correctly through a vector env's shared memory.

    Same values, sampling and checks as ``Text``; only the shared-memory transport of
    ``AsyncVectorEnv`` differs (see the module docstring for the upstream defect).
    """


def text_spaces() -> tuple[TextSpace, TextSpace]:
    """The observation and action spaces of every ``gaca/`` env (printable ASCII)."""
    return (TextSpace(MAX_OBSERVATION_CHARS, min_length=0, charset=TEXT_CHARSET),
            TextSpace(MAX_ACTION_CHARS, min_length=0, charset=TEXT_CHARSET))


class SharedTexts(Sequence):
    """The texts of a shared-memory buffer, decoded whenever read.

    ``AsyncVectorEnv`` keeps the object that ``read_from_shared_memory`` returned once and
    hands out ``deepcopy`` of it (or the object itself with ``copy=False``): a deep copy
    is a plain tuple of the current texts; indexing and iterating read the live buffer.
    """

    def __init__(self, space: TextSpace, buffer: np.ndarray) -> None:
        self._space, self._buffer = space, buffer
        self._codes = np.frombuffer("".join(space.character_list).encode("latin-1"),
                                    dtype=np.uint8)

    def _decode(self, row: np.ndarray) -> str:
        end = np.flatnonzero(row >= len(self._codes))
        row = row[: end[0]] if len(end) else row
        return self._codes[row].tobytes().decode("latin-1")

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self._decode(row) for row in self._buffer[index])
        return self._decode(self._buffer[index])

    def __len__(self) -> int:
        return len(self._buffer)

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __deepcopy__(self, memo) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


@create_shared_memory.register(TextSpace)
def _create_text_memory(space: TextSpace, n: int = 1, ctx=None):
    import multiprocessing as mp

    return (ctx or mp).Array(np.dtype(np.int32).char, n * space.max_length)


@read_from_shared_memory.register(TextSpace)
def _read_text_memory(space: TextSpace, shared_memory, n: int = 1) -> SharedTexts:
    buffer = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)
    return SharedTexts(space, buffer.reshape(n, space.max_length))


@write_to_shared_memory.register(TextSpace)
def _write_text_memory(space: TextSpace, index: int, value: str, shared_memory) -> None:
    size = space.max_length
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * size:(index + 1) * size]
    lookup = np.full(256, len(space.character_set), dtype=np.int32)
    for i, c in enumerate(space.character_list):
        lookup[ord(c)] = i
    codes = lookup[np.frombuffer(value.encode("latin-1", "replace"), dtype=np.uint8)]
    row[:] = len(space.character_set)
    row[:len(codes)] = codes[:size]


def observation_key(observation: str) -> str:
    """The state key of an observation text: GiGPO's anchor (an env's ``anchor=
    "observation"``, and envs that expose no true state)."""
    return stable_hash(["observation", observation])


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
    - ``_sim_step(action) -> SimStep``: apply an *admissible* action, in the simulator's
      own spelling (what ``_resolve`` returned). A simulator whose parser reads more than
      it lists (ScienceWorld) may pass free text on and return ``None`` when its parser
      rejects it: the step is then an invalid action, as if ``_resolve`` had refused it.

    ``anchor="observation"`` replaces the canonical key by a hash of the observation text.
    Invalid actions never reach the simulator: they return the previous observation's
    admissible actions, state key and extra info, reward 0 and ``action_valid=False``.

    After the episode has terminated, every further step is a no-op that repeats the
    final observation with reward 0, ``terminated=True``, no admissible actions and
    ``action_valid=False``; it never raises and never reaches the simulator.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, render_mode: str | None = None, anchor: Anchor = "state") -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if anchor not in ("state", "observation"):
            raise ValueError(f"anchor must be 'state' or 'observation', got {anchor!r}")
        self.render_mode = render_mode
        self.anchor = anchor
        self.observation_space, self.action_space = text_spaces()
        self._task_id: int | None = None
        self._last: SimStep | None = None
        self._won = False
        self._shown: dict[str, str] = {}  # shown (ASCII, normalised) action -> simulator's

    # ----------------------------------------------------------------- hooks
    @property
    def num_tasks(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_task(self, task_id: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_reset(self, task_id: int) -> SimStep:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sim_step(self, action: str) -> SimStep | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _resolve(self, action: str) -> str | None:
        """The simulator's spelling of a normalised action, or ``None`` when it is not
        admissible now (parametric envs such as WebShop's ``search[...]`` override)."""
        return self._shown.get(action)

    def _listed_form(self, raw: str, normalised: str) -> str:
        """How ``info["admissible_actions"]`` writes an action: normalised (lower case,
        whitespace collapsed, ASCII) unless the simulator's own listing spells it
        otherwise (WebShop keeps its spaces). Either form is accepted."""
        return normalised

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
        if self._last.terminated:  # the episode is over: nothing reaches the simulator
            obs, info = self._emit(self._last, action_valid=False)
            return obs, 0.0, True, False, info
        raw = self._resolve(normalize_action(action))
        sim = None if raw is None else self._sim_step(raw)
        if sim is None:
            invalid = SimStep(_INVALID_FEEDBACK, self._last.admissible_actions,
                              self._last.state_key, won=self._won,
                              extra_info=self._last.extra_info)
            obs, info = self._emit(invalid, action_valid=False)
            return obs, 0.0, False, False, info
        self._last = sim
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
        key = sim.state_key if self.anchor == "state" else observation_key(obs)
        raw_actions = () if sim.terminated else sim.admissible_actions
        self._shown, listed = {}, []
        for raw in raw_actions:
            shown = normalize_action(to_charset(raw, MAX_ACTION_CHARS))
            if shown not in self._shown:
                self._shown[shown] = raw
                listed.append(self._listed_form(raw, shown))
        info = {
            "admissible_actions": tuple(listed),
            "state_key": key,
            "task": self._sim_task(self._task_id),
            "task_id": self._task_id,
            "won": bool(self._won or sim.won),
            "action_valid": action_valid,
        }
        info.update(sim.extra_info)
        return obs, info

