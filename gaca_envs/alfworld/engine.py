"""ALFWorld's real text engine (TextWorld's PDDL backend) with its reset costs cached.

TextWorld's ``PddlEnv`` re-parses the game's grammar and runs Fast Downward's PDDL-to-SAS
translator twice on every ``load`` and again twice on every ``reset`` (about 1-6 s a
reset). The translation depends only on the game file, so :class:`CachedPddlEnv` does it
once per game: in memory (an LRU) and on disk (``~/.cache/gaca/alfworld``, keyed by a hash
of the domain and problem), and restores the translated task into the Fast Downward
library on each reset. Stepping, admissible actions and goal checks are the unchanged
upstream code; the text (feedback and command templates) comes from the game's grammar
through :class:`~gaca_envs.alfworld.fastgen.FastGrammar` (same output, no re-parsing, no
deep copies) unless the fast path is off (``fast=False``).
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaca_envs.core import stable_hash
from gaca_envs.data import cache_dir

_TRANSLATION_VERSION = "1"
_MEMORY_GAMES = 64


@dataclass
class CompiledGame:
    """Everything a reset needs that depends only on the game file."""

    data: dict[str, Any]
    logic: Any  # textworld.envs.pddl.logic.GameLogic
    task: Any  # fast_downward translate Task
    sas: str
    sas_replan: str


_GAMES: "OrderedDict[tuple[str, bool], CompiledGame]" = OrderedDict()
_LOGIC: dict[str, Any] = {}


def compile_game(path: str | os.PathLike, fast: bool = True) -> CompiledGame:
    """Parse and translate a ``game.tw-pddl`` file, reusing the memory and disk caches."""
    key = (str(Path(path).resolve()), fast)
    game = _GAMES.get(key)
    if game is not None:
        _GAMES.move_to_end(key)
        return game
    with open(key[0]) as f:
        data = json.load(f)
    game = CompiledGame(data, _logic(data["pddl_domain"], data["grammar"], fast),
                        *_translation(data["pddl_domain"], data["pddl_problem"]))
    _GAMES[key] = game
    while len(_GAMES) > _MEMORY_GAMES:
        _GAMES.popitem(last=False)
    return game


def _logic(domain: str, grammar: str, fast: bool = True):
    from textworld.envs.pddl import logic as pddl_logic

    key = stable_hash([domain, grammar, str(fast)])
    if key not in _LOGIC:
        if len(_LOGIC) >= _MEMORY_GAMES:
            _LOGIC.clear()
        logic = pddl_logic.GameLogic(domain=domain, grammar=grammar)
        if fast:
            from gaca_envs.alfworld.fastgen import FastGrammar

            logic.grammar = FastGrammar(logic.grammar)
        _LOGIC[key] = logic
    return _LOGIC[key]


def _translation(domain: str, problem: str) -> tuple[Any, str, str]:
    """Fast Downward's (task, sas, sas_replan) for a domain and problem, cached on disk."""
    import fast_downward

    path = cache_dir("alfworld") / f"{stable_hash([_TRANSLATION_VERSION, domain, problem])}.pkl"
    if path.exists():
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # a truncated or stale file: translate again
            pass
    task, sas = fast_downward.pddl2sas(domain, problem)
    _, sas_replan = fast_downward.pddl2sas(domain, problem, optimize=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump((task, sas, sas_replan), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)  # atomic: readers never see a partial file
    return task, sas, sas_replan


def _make_state_class():
    """Define the cached PddlState lazily so importing this module needs no TextWorld."""
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.logic import Proposition, Type, Variable

    class CachedPddlState(pddl_logic.PddlState):
        """``PddlState`` built from an already translated task (no translator run)."""

        def __init__(self, downward_lib, game: CompiledGame):  # noqa: D107
            # Same attributes as PddlState.__init__, minus the two translator calls.
            from collections import Counter, defaultdict

            self._facts = defaultdict(set)
            self._vars_by_name = {}
            self._vars_by_type = defaultdict(set)
            self._var_counts = Counter()
            self._logic = game.logic
            self.downward_lib = downward_lib
            self.pddl_problem = game.data["pddl_problem"]
            self.task, self.sas, self.sas_replan = game.task, game.sas, game.sas_replan
            self._actions = {a.name: a for a in self.task.actions}
            for t in self.task.types:
                try:
                    self._logic.types.add(Type(t.name, t.supertype_names))
                except ValueError:  # already known
                    pass
            downward_lib.load_sas(self.sas.encode("utf-8"))
            downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
            self.name2type = {o.name: o.type_name for o in self.task.objects}
            self.add_facts(self._initial_facts(fast_downward, Proposition, Variable))
            atoms = (pddl_logic.Atom * downward_lib.get_state_size())()
            downward_lib.get_state(atoms)
            facts = (a.get_fact(self.name2type) for a in atoms)
            self.add_facts([f for f in facts if not f.is_negation])

        def _initial_facts(self, fast_downward, Proposition, Variable):
            conditions = fast_downward.translate.pddl.conditions
            f_expression = fast_downward.translate.pddl.f_expression
            facts = []
            for atom in self.task.init:
                if isinstance(atom, conditions.Atom) and atom.predicate != "=":
                    facts.append(Proposition(atom.predicate, [Variable(a, self.name2type[a])
                                                              for a in atom.args]))
                elif isinstance(atom, f_expression.Assign):
                    name = str(atom.expression.value)
                    if atom.fluent.symbol != "total-cost" and not name.isdigit():
                        facts.append(Proposition(name, [Variable(a, self.name2type[a])
                                                        for a in atom.fluent.args]))
            return facts

    return CachedPddlState


def _make_env_class():
    from textworld.core import GameState
    from textworld.envs.pddl.pddl import PddlEnv

    state_class = _make_state_class()

    class CachedPddlEnv(PddlEnv):
        """TextWorld's ``PddlEnv`` whose load and reset reuse :func:`compile_game`."""

        fast = True

        def load(self, filename: str) -> None:
            self._compiled = compile_game(filename, self.fast)
            self._game_file = filename
            self._game_data = self._compiled.data
            self.walkthrough = self._game_data.get("walkthrough")
            self._logic = self._compiled.logic
            self._pddl_state = state_class(self.downward_lib, self._compiled)
            self._entity_infos = self._get_entity_infos()

        def reset(self):
            self._pddl_state = state_class(self.downward_lib, self._compiled)
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            context = {"state": self._pddl_state, "facts": list(self._pddl_state.facts),
                       "variables": {}, "mapping": {}, "entity_infos": self._entity_infos}
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

        def replan(self) -> list[str]:
            """Fast Downward's optimal plan from the current state (seconds, not ms)."""
            return list(self._pddl_state.replan(self._entity_infos))

    return CachedPddlEnv


_ENV_CLASS = None


def make_engine(demangle: bool = True, fast: bool = True):
    """An engine (its own copy of the Fast Downward library: a new one, or one a closed
    env released), names demangled as ALFWorld; ``fast=False`` keeps TextWorld's own text
    generation."""
    global _ENV_CLASS
    import textworld

    if _ENV_CLASS is None:
        _ENV_CLASS = _make_env_class()
    with _FREE_LOCK:
        engine = _FREE.pop() if _FREE else None
    if engine is None:
        engine = _ENV_CLASS(textworld.EnvInfos(won=True, admissible_commands=True))
    engine.fast = fast
    return AlfredNames(engine) if demangle else engine


class AlfredNames:
    """Gives objects ALFWorld's readable names (``apple 1``) after each load."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def load(self, filename: str) -> None:
        from alfworld.agents.utils.misc import Demangler

        self.engine.load(filename)
        infos = self.engine._entity_infos
        demangler = Demangler(game_infos=infos, shuffle=False)
        for info in infos.values():
            info.name = demangler.demangle_alfred_name(info.id)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


#: Engines of closed envs, handed to the next envs of the process. TextWorld copies and
#: loads ``libdownward.so`` for every PDDL engine and never unloads it (about 3.6 MB an
#: engine): a server making an env per session grew without bound (3.4 GB after 30
#: minutes of 64 sessions). Reusing engines bounds that by the most envs open at once.
#: (Unloading the library instead crashed the process once in four tries.)
_FREE: list = []
_FREE_LOCK = threading.Lock()
MAX_FREE_ENGINES = 256


def release_engine(engine) -> None:
    """Return a closed env's engine for reuse (:func:`make_engine` takes it back)."""
    inner = getattr(engine, "engine", engine)  # AlfredNames wraps the PDDL engine
    if _ENV_CLASS is None or not isinstance(inner, _ENV_CLASS):
        close = getattr(inner, "close", None)
        if close is not None:
            close()
        return
    with _FREE_LOCK:
        if len(_FREE) < MAX_FREE_ENGINES:
            _FREE.append(inner)
