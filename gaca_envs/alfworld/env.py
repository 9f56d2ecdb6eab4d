"""``gaca/TextWorld-v0`` and ``gaca/ALFWorld-v0``: the real engines behind the text contract."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from gaca_envs.alfworld.canonical import ALFWORLD_BOOKKEEPING, facts_key
from gaca_envs.alfworld.games import find_data_dir, list_games
from gaca_envs.core import Anchor, SimStep, TextEnv, normalize_action

_TASK_RE = re.compile(r"Your task is to:\s*(.+)")
_BANNER_CHARS = frozenset(" $|\\/_<>")
_PROMPT_RE = re.compile(r"\n>[^\n]*(?:\n[^\n]*)*\Z")  # Inform's last prompt line, and after


def inform_text(feedback: str) -> str:
    """An Inform game's (``.z8``/``.ulx``) feedback as a player reads it: without the
    title's ASCII-art banner, the ``>`` prompt and the status line after it (the room
    and the score, which TextWorld appends), and without runs of blank lines."""
    lines = [line for line in feedback.split("\n")
             if not (line.strip() and set(line) <= _BANNER_CHARS and line.strip() != ">")]
    text = _PROMPT_RE.sub("", "\n".join(lines))
    return re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip()


class TextWorldEnv(TextEnv):
    """Any TextWorld game (``.z8``, ``.ulx`` or ``.tw-pddl``) under the gaca text contract.

    ## Description
    Plays TextWorld games with TextWorld's own engine. ``game`` is a game file, a folder of
    game files, or a list of them; each file is one task (task ids follow sorted paths).
    ``generate={...}`` instead makes games with TextWorld's generator, once, into a cache
    (:mod:`gaca_envs.alfworld.generated`): the same spec gives the same games anywhere.

    ## Action Space
    ``Text``: any string. Actions are lower-cased and whitespace-collapsed; one that is not
    in ``info["admissible_actions"]`` does nothing and sets ``info["action_valid"]=False``.

    ## Observation Space
    ``Text``: the game's feedback (printable ASCII); an Inform game's (``.z8``, ``.ulx``)
    without its title banner, ``>`` prompt and status line (:func:`inform_text`).

    ## Starting State
    The game's start. ``options={"task_id": k}`` picks game k; otherwise ``np_random`` does.

    ## Rewards
    The change of the game's score on that step (TextWorld games score their quest
    milestones; a generated single-quest game gives 1 at the win).

    ## Episode End
    Terminated when the game is won or lost. No step budget of its own (``gymnasium.make``
    adds ``max_episode_steps=50``).

    ## Info
    The contract keys; ``state_key`` hashes the game's logic facts (its true state).
    ``env.unwrapped.expert_action()`` is TextWorld's policy command from the current state.

    ## Arguments
    ``game`` or ``generate`` (``count``, ``seed``, ``rooms``, ``objects``,
    ``quest_length``), ``anchor`` (``state`` or ``observation``), ``render_mode`` (``ansi``),
    ``fast_textgen`` (PDDL games: the fast text generation, identical output; default on,
    ``GACA_ALFWORLD_FAST=0`` turns it off).

    ## Version History
    v0: initial version; since 2026-12-07 an Inform game's feedback loses its banner,
    prompt and status line, and ``generate`` makes games.
    """

    _exclude_facts: frozenset[str] = frozenset()

    def __init__(self, game: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 anchor: Anchor = "state", render_mode: str | None = None,
                 fast_textgen: bool | None = None,
                 generate: dict[str, int] | None = None) -> None:
        from gaca_envs.alfworld.fastgen import fast_enabled

        super().__init__(render_mode=render_mode, anchor=anchor)
        self.fast_textgen = fast_enabled(fast_textgen)
        if (game is None) == (generate is None):
            raise ValueError("TextWorld-v0 needs game=PATH (a game file, folder or list) or "
                             "generate={count, seed, rooms, objects, quest_length} (games "
                             "made by TextWorld's generator), one of the two")
        if generate is not None:
            from gaca_envs.alfworld.generated import generated_games

            game = generated_games(generate)
        self.game_files: tuple[Path, ...] = _game_files(game)
        self._engine: Any = None
        self._game_state: Any = None
        self._loaded: int | None = None
        self._commands: dict[str, str] = {}
        self._tasks: dict[int, str] = {}
        self._plan: list[str] | None = None
        self._score = 0.0

    @property
    def num_tasks(self) -> int:
        return len(self.game_files)

    def _sim_task(self, task_id: int) -> str:
        return self._tasks.get(task_id, "")

    # ------------------------------------------------------------- engine hooks
    def _new_engine(self):
        import textworld

        infos = textworld.EnvInfos(won=True, lost=True, admissible_commands=True, facts=True,
                                   objective=True, score=True, policy_commands=True)
        return textworld.start(str(self.game_files[0]), infos)

    def close(self) -> None:
        """Hand the engine back for reuse (see :func:`release_engine`)."""
        from gaca_envs.alfworld.engine import release_engine

        engine, self._engine, self._game_state = self._engine, None, None
        self._loaded = None
        if engine is not None:
            release_engine(engine)
        super().close()

    def _facts(self, state) -> Iterable:
        return state["facts"]

    def _instruction(self, state) -> str:
        return state.get("objective") or ""

    def _engine_plan(self) -> list[str]:
        return list(self._game_state.get("policy_commands") or [])

    def _step_reward(self, state, score: float) -> float:
        return score - self._score

    def _extra_info(self, task_id: int) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------- adapter
    def _sim_reset(self, task_id: int) -> SimStep:
        if self._engine is None:
            self._engine = self._new_engine()
        if self._loaded != task_id:
            self._engine.load(str(self.game_files[task_id]))
            self._loaded = task_id
            self._speed_up_text()
        state = self._engine.reset()
        self._score = 0.0
        self._tasks[task_id] = self._instruction(state)
        self._plan = self._initial_plan()
        return self._sim_from(state, reward=0.0)

    def _speed_up_text(self) -> None:
        """A PDDL game (``.tw-pddl``) loaded by TextWorld derives its text with the fast
        grammar too (Inform games, ``.z8``/``.ulx``, have no such grammar)."""
        from textworld.envs.pddl.pddl import PddlEnv

        from gaca_envs.alfworld.fastgen import FastGrammar

        if self.fast_textgen and isinstance(self._engine, PddlEnv) and \
                not isinstance(self._engine._logic.grammar, FastGrammar):
            self._engine._logic.grammar = FastGrammar(self._engine._logic.grammar)

    def _sim_step(self, action: str) -> SimStep:
        assert self._last is not None
        before = self._last.state_key
        state, score, _ = self._engine.step(self._commands[action])
        sim = self._sim_from(state, reward=self._step_reward(state, float(score or 0.0)))
        self._score = float(score or 0.0)
        self._follow_plan(action, before, sim.state_key)
        return sim

    def _sim_from(self, state, reward: float) -> SimStep:
        self._game_state = state
        self._commands = {normalize_action(c): c for c in state["admissible_commands"]}
        self._commands.pop("", None)
        won = bool(state["won"])
        done = won or bool(state.get("lost"))
        assert self._task_id is not None
        inform = self.game_files[self._task_id].suffix in (".z8", ".ulx")
        return SimStep(inform_text(state.feedback) if inform else state.feedback,
                       tuple(sorted(self._commands)),
                       facts_key(self._facts(state), self._exclude_facts),
                       reward=reward, terminated=done, won=won,
                       extra_info=self._extra_info(self._task_id))

    # ------------------------------------------------------------- expert
    def _initial_plan(self) -> list[str] | None:
        return None

    def _follow_plan(self, action: str, before: str, after: str) -> None:
        """Keep the expert's plan while the agent follows it or changes nothing."""
        if self._plan and normalize_action(self._plan[0]) == action:
            self._plan.pop(0)
        elif before != after:
            self._plan = None

    def expert_action(self) -> str | None:
        """The expert's next action from the current state (``None`` when none is known)."""
        if self._last is None:
            raise RuntimeError("call reset() before expert_action()")
        if self._plan is None:
            self._plan = [normalize_action(a) for a in self._engine_plan()]
        return self._plan[0] if self._plan else None


class ALFWorldEnv(TextWorldEnv):
    """ALFWorld's household tasks on the real ALFWorld text engine.

    ## Description
    ALFWorld (Shridhar et al., 2021) text games: the agent moves between receptacles, takes,
    places, opens, heats, cools, cleans and uses objects to reach a goal such as "put a
    clean apple in fridge". The engine is TextWorld's PDDL backend with ALFWorld's game
    files, grammar and object names; translation of each game is cached (see
    ``gaca_envs.alfworld.engine``).

    ## Action Space
    ``Text``: ALFWorld commands (``go to fridge 1``, ``take apple 1 from countertop 2``,
    ``move apple 1 to fridge 1``, ``open``, ``close``, ``heat``, ``cool``, ``clean``,
    ``use``, ``examine``, ``look``, ``inventory``, ``help``). Inadmissible text is a no-op.

    ## Observation Space
    ``Text``: the engine's feedback; the first one describes the room and the task.

    ## Starting State
    Task ``k`` of the split is game ``k`` in the order of ``sorted(task_folder/trial)``
    (``env.unwrapped.games[k]``); without ``options={"task_id": k}`` the game is drawn with
    ``np_random`` (same seed, same game, in any process).

    ## Rewards
    1.0 on the step that completes the task, else 0.

    ## Episode End
    Terminated on success. Truncated by ``max_episode_steps=50`` (registration).

    ## Info
    Contract keys plus ``task_type``. ``state_key`` hashes the PDDL world facts (agent
    location, inventory, object locations, opened, toggled, clean/hot/cool/sliced), leaving
    out the ``checked``/``examined`` bookkeeping, so ``look`` or ``examine`` keep it and
    ``open`` changes it.

    ## Expert
    ``env.unwrapped.expert_action()``: the game's stored walkthrough while the agent is on
    it (or has only made no-op moves), else Fast Downward's optimal plan from the current
    state (a replan costs seconds), followed until the agent departs from it.

    ## Memory
    128 live episodes in the collector's 8 workers hold 2.5 GB (PSS of every process; 19
    MB an episode; 64: 2.1 GB, 16: 1.7 GB; ``benchmarks/bench_env_memory.py --suite
    alfworld``). A process grows about 1 MB a game it loads, so the collector's workers
    are recycled after 100 resets (``env.recycle_after``).

    ## Arguments
    ``split`` (``train``, ``valid_seen``, ``valid_unseen``), ``task_types`` (subset of the
    six), ``data_dir`` (else ``$ALFWORLD_DATA``, ``$GACA_DATA/alfworld``,
    ``~/.cache/alfworld``), ``anchor``, ``render_mode``, ``fast_textgen`` (the fast text
    generation of ``gaca_envs.alfworld.fastgen``, byte-identical to TextWorld's; default on,
    ``False`` or ``GACA_ALFWORLD_FAST=0`` for TextWorld's own).

    ## Version History
    v0: initial version (ALFWorld game files 2.1.x, "move X to Y" actions).
    """

    _exclude_facts = ALFWORLD_BOOKKEEPING

    def __init__(self, split: str = "train", task_types: Sequence[str] | None = None,
                 data_dir: str | os.PathLike | None = None, anchor: Anchor = "state",
                 render_mode: str | None = None, fast_textgen: bool | None = None) -> None:
        self.data_dir = find_data_dir(data_dir)
        self.split = split
        self.games = list_games(self.data_dir, split, task_types)
        if not self.games:
            raise ValueError(f"no ALFWorld games of types {task_types} in {split}")
        super().__init__(game=[g.path for g in self.games], anchor=anchor,
                         render_mode=render_mode, fast_textgen=fast_textgen)

    def _new_engine(self):
        from gaca_envs.alfworld.engine import make_engine

        return make_engine(fast=self.fast_textgen)

    def _facts(self, state) -> Iterable:
        return state["_facts"]

    def _instruction(self, state) -> str:
        match = _TASK_RE.search(state.feedback)
        return match.group(1).strip() if match else ""

    def _step_reward(self, state, score: float) -> float:
        return 1.0 if state["won"] else 0.0

    def _extra_info(self, task_id: int) -> dict[str, Any]:
        return {"task_type": self.games[task_id].task_type}

    def _initial_plan(self) -> list[str] | None:
        walkthrough = self._engine.walkthrough
        return [normalize_action(a) for a in walkthrough] if walkthrough else None

    def _engine_plan(self) -> list[str]:
        return self._engine.replan()


def _game_files(game) -> tuple[Path, ...]:
    items = [game] if isinstance(game, (str, os.PathLike)) else list(game)
    files: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for ext in ("*.z8", "*.ulx", "*.tw-pddl") for p in item.rglob(ext))
            if not found:
                raise FileNotFoundError(f"no TextWorld game files (.z8/.ulx/.tw-pddl) in {item}")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"TextWorld game file {item} does not exist")
    return tuple(files)
