"""``gaca/ScienceWorld-v0``: ScienceWorld's 30 task types on the real engine."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any, Iterable, Sequence

from gaca_envs.core import MAX_ACTION_CHARS, Anchor, SimStep, TextEnv, normalize_action
from gaca_envs.scienceworld.canonical import state_key
from gaca_envs.scienceworld.jvm import ENVS_PER_JVM, acquire, check_envs_per_jvm, check_heap
from gaca_envs.scienceworld.tasks import (SPLITS, list_variations, resolve_task_types,
                                          simplification_string)

#: The engine's answer to text its parser cannot read; nothing in the world changes.
REJECTED = "No known action matches that input."
#: The engine's question when an action could mean several objects.
AMBIGUOUS = "Ambiguous request"
JAVA_HINT = ("ScienceWorld's engine needs a Java runtime (java on PATH). Debian/Ubuntu: "
             "sudo apt-get install default-jre-headless, or run bash scripts/setup.sh "
             "scienceworld, which installs it")


#: How many gold recordings the expert asks for before it takes one that did not replay.
GOLD_TRIES = 4


def gold_action(plan: list[str], pending: bool) -> str | None:
    """The gold path's next action (``plan`` is consumed by the caller). The recording was
    made on one run of the world; where this run asks which object was meant and the
    recording did not, the answer is ``0`` (the choices name interchangeable objects);
    where the recording answered a question this run did not ask, the answer is skipped."""
    if pending:
        return plan[0] if plan and plan[0].isdigit() else "0"
    while plan and plan[0].isdigit():
        plan.pop(0)
    return plan[0] if plan else None


class ScienceWorldError(RuntimeError):
    """ScienceWorld's engine could not start (Java or the package is missing)."""


def check_requirements() -> None:
    """Raise :class:`ScienceWorldError` naming what to install when Java or the
    ``scienceworld`` package is missing."""
    if shutil.which("java") is None:
        raise ScienceWorldError(JAVA_HINT)
    if importlib.util.find_spec("scienceworld") is None:
        raise ScienceWorldError("gaca/ScienceWorld-v0 needs the scienceworld package: "
                                "pip install -e '.[scienceworld]'")


class ScienceWorldEnv(TextEnv):
    """ScienceWorld (Wang et al., 2022): 30 elementary-science task types in one simulated
    house (matter, measurement, electricity, classification, biology, chemistry, forces,
    genetics), on the engine of the ``scienceworld`` package (Scala, run in a JVM).

    ## Description
    Each task is one *variation* of one task type (``boil`` with variation 21, ...). The
    agent moves between rooms, opens, takes, heats, connects, waits and ``focus on``-s the
    object the task is about; ScienceWorld scores partial progress (0-100).

    ## Action Space
    ``Text``. ScienceWorld's parser reads free text: any action it accepts is played, also
    when it is spelled otherwise than in ``info["admissible_actions"]`` (the engine lists
    one name per object, its parser knows more: ``open door to kitchen`` is accepted while
    the list says ``open kitchen door``). Text the parser rejects is a no-op
    (``action_valid=False``, "Nothing happens."), as is anything over 1,024 characters.
    When an action could mean several objects the engine asks which, listing numbered
    choices: then only those numbers (``0``, ``1``, ...) are admissible.

    ## Observation Space
    ``Text``: the engine's answer; after a reset, the room (``look around``) and the task.

    ## Starting State
    Task ``k`` is the k-th (task type, variation) of the split: task types in ScienceWorld's
    task-id order (1-1 boil ... 10-2 mendelian-genetics-unknown-plant), variations ascending
    (``env.unwrapped.variations[k]``). Without ``options={"task_id": k}``, ``np_random``
    draws it. A reset reloads the variation, which fully determines the world.

    ## Rewards
    ``(score_t - score_{t-1}) / 100`` with ``score = max(engine score, 0)``: ScienceWorld's
    partial credit, so the rewards of an episode sum to its final ``info["score"]``. A
    failed task (engine score -100, e.g. ``focus on`` the wrong object) scores 0: that
    step takes back the credit earned so far.

    ## Episode End
    Terminated when the engine marks the task completed (``won`` when its score is 100) or
    failed (score < 0, ``won=False``). Truncated by ``max_episode_steps=100``
    (registration): the default step limit of the ``scienceworld`` package
    (``ScienceWorldEnv(envStepLimit=100)``). Five task types have gold paths longer than
    that on some variations (inclined-plane friction, mendelian genetics): give
    ``gymnasium.make(..., max_episode_steps=N)`` to allow more.

    ## Info
    Contract keys plus ``score`` (in [0, 1]), ``task_type``, ``variation``. The admissible
    actions are the engine's valid action-object combinations: 400-900 at the start of a
    task, thousands once containers are open (median 2,765 and up to 8,362 over the gold
    paths of boil, grow-fruit and the two genetics types). Listing them draws from the
    engine's random generator, so they are listed on every step, never cached.
    ``state_key`` hashes the engine's object tree (every object's properties, contents
    and connections, ids left out, temperatures in 10 C bins), which doors are open, the
    goal progress, the score and any pending question (see
    ``gaca_envs.scienceworld.canonical``): ``look around``, ``inventory``, ``task`` and
    ``look at``/``examine`` keep it; two paths to one world give one key. The world also
    changes on its own (the first tick adds objects outside, the house drifts towards
    thermal equilibrium, pots heat, plants grow, animals wander): the key then changes
    with it, even after ``look around`` or ``wait``. Drains are not in the key.

    ## Expert
    ``env.unwrapped.expert_action()``: the engine's gold action sequence for the variation,
    while the agent follows it (actions that change nothing, such as ``look around`` or a
    rejected text, keep it). After any other departure it returns ``None``: ScienceWorld
    has no planner to replan from an arbitrary state. The recording is made on the
    episode's first call and checked by playing it (up to ``GOLD_TRIES`` recordings); when
    the engine rejects the expert's own next action, the expert returns ``None`` and the
    next episode of that task records anew.

    ## Determinism
    A reset reloads the variation, which seeds the engine's random generator, and every
    engine has its own generator and counters (see Memory): an env's episodes are the
    same on a shared JVM as on a JVM of its own, given the same tasks before (tested on
    every task type). What else made worlds depend on the past: the engine iterates hash
    sets of its objects, ordered by HotSpot's identity hash codes, drawn per Java thread.
    Engine JVMs therefore run with a constant identity hash (``-XX:hashCode=2``). Before,
    grow-fruit's world changed from step 14 between two fresh JVMs, and the gold path of
    boil's first test variation was 84, 90 or 102 steps after different tasks; now the
    gold paths of boil (90), melting point (96), grow-fruit (83), chemistry-mix (19) and
    mendelian genetics (148) are the same after three different orders of those tasks,
    and a 72-step random grow-fruit episode replays exactly.

    One dependence remains, inside an engine: replaying grow-fruit's gold path after a
    reset of the same task gives a different world from step 59 (before and after the
    hash change), so some engine state outside the seed carries over between loads; the
    deterministic task types replay exactly (tested on boil and find-animal). The worlds
    of the pollinating types also differ from those of the package's default JVM (which
    bee goes where); 30 of 30 task types' gold paths still win.

    ## Memory
    The envs of one process share engine JVMs, ``envs_per_jvm`` (default 16) to a JVM,
    each engine in a class loader of its own so that none shares the engine's global state
    with another (``gaca_envs.scienceworld.jvm``); a JVM's heap (``-Xmx``) is sized for
    its engines, 192 MB + 64 MB an engine (``jvm_heap="auto"``; 1,216 MB for 16). With
    the collector's 8 workers, 128 live episodes run in 8 JVMs and hold 5.9 GB (PSS of
    every process: 46 MB an episode; 16 episodes 4.4 GB, against 7.4 GB with a JVM per
    env, at 1.21x its steps/s; ``benchmarks/bench_env_memory.py --suite scienceworld``,
    docs/benchmarks.md). A JVM that dies fails only the episodes of its engines; each of
    those envs makes a new engine at its next reset.

    ## Arguments
    ``split`` (``train``, ``dev``, ``test``: the engine's own variation lists),
    ``task_types`` (names such as ``boil``, ids such as ``1-1``, or a comma-separated
    string), ``simplifications`` (``easy``, or flags among ``teleportAction``,
    ``selfWateringFlowerPots``, ``openContainers``, ``openDoors``, ``noElectricalAction``),
    ``envs_per_jvm`` (engines per JVM, default 16), ``jvm_heap`` (the JVM's ``-Xmx``:
    ``auto``, sized by ``envs_per_jvm``; ``768m``, ``2g``; ``None`` for the JVM's default,
    a quarter of the machine), ``anchor``, ``render_mode``.

    ## Version History
    v0: initial version (scienceworld 1.2.3).
    v0, 2026-12-01: engines share JVMs, with a constant identity hash: the worlds of the
    pollinating types (grow-fruit, genetics) and some gold paths differ from earlier v0
    runs (they were not reproducible before); the id stays v0.
    """

    def __init__(self, split: str = "test", task_types: str | Sequence[str] | None = None,
                 simplifications: str | Iterable[str] | None = None, anchor: Anchor = "state",
                 render_mode: str | None = None, jvm_heap: str | None = "auto",
                 envs_per_jvm: int = ENVS_PER_JVM) -> None:
        super().__init__(render_mode=render_mode, anchor=anchor)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        check_requirements()  # before the arguments: their check reads the package
        self.split = split
        self.task_types = resolve_task_types(task_types)
        self.simplifications = simplification_string(simplifications, self.task_types)
        self.jvm_heap = check_heap(jvm_heap)
        self.envs_per_jvm = check_envs_per_jvm(envs_per_jvm)
        self._engine = acquire(self.jvm_heap, self.envs_per_jvm)
        self._server = self._engine.server
        self.variations = list_variations(self._server, split, self.task_types)
        self._tasks: dict[int, str] = {}
        self._gold: dict[int, tuple[str, ...]] = {}
        self._plan: list[str] | None = None
        self._score = 0.0
        self._doors: list[tuple[str, Any]] = []
        self._pending = ""  # the engine's open which-object question
        self._fresh = False  # no action has been played since the reset

    @property
    def num_tasks(self) -> int:
        return len(self.variations)

    def _sim_task(self, task_id: int) -> str:
        return self._tasks.get(task_id, "")

    # ------------------------------------------------------------- adapter
    def _sim_reset(self, task_id: int) -> SimStep:
        if not self._engine.alive():  # its JVM died: the episode it held failed
            self._engine.close()
            self._engine = acquire(self.jvm_heap, self.envs_per_jvm)
            self._server = self._engine.server
        observation = self._load(task_id)
        self._plan = list(self._gold[task_id]) if task_id in self._gold else None
        self._score, self._pending, self._fresh = 0.0, "", True
        return self._sim_state(observation, reward=0.0, done=False, won=False)

    def _load(self, task_id: int) -> str:
        """Load task ``task_id`` afresh; its first observation (the room and the task). A
        load seeds the engine's random generator with the variation: the initial world is
        a function of (task type, variation, simplifications) alone."""
        v = self.variations[task_id]
        self._server.load(v.task_type, v.variation, self.simplifications, False)
        self._tasks[task_id] = str(self._server.getTaskDescription()).strip()
        self._doors = self._find_doors()
        return f"{self._server.freeActionLook().strip()}\n\n{self._tasks[task_id]}"

    def _resolve(self, action: str) -> str | None:
        shown = self._shown.get(action)
        if shown is not None or self._pending:  # a pending question takes only its numbers
            return shown
        return action if 0 < len(action) <= MAX_ACTION_CHARS else None

    def _sim_step(self, action: str) -> SimStep | None:
        try:
            return self._play(action)
        except Exception as err:
            if self._engine.alive():
                raise
            raise ScienceWorldError(f"the engine's JVM (pid {self._engine.pid}) died: this "
                                    f"episode failed; the next reset starts a new engine") \
                from err

    def _play(self, action: str) -> SimStep | None:
        assert self._last is not None
        observation = str(self._server.step(action))
        if observation.startswith(REJECTED):
            if self._plan and self._plan[0] == action:  # the recording does not replay here
                self._gold.pop(self._task_id, None)  # the next episode records anew
                self._plan = None
            return None
        engine_score = int(round(100 * float(self._server.getScore())))
        completed = bool(self._server.getCompleted())
        answered = bool(self._pending)  # this action answered a which-object question
        self._pending = observation if observation.startswith(AMBIGUOUS) else ""
        score = max(engine_score, 0) / 100
        reward, self._score = score - self._score, score
        sim = self._sim_state(observation, reward=reward, done=completed or engine_score < 0,
                              won=completed and engine_score >= 100, engine_score=engine_score)
        self._follow_plan(action, self._last.state_key, sim.state_key, answered)
        return sim

    def _sim_state(self, observation: str, reward: float, done: bool, won: bool,
                   engine_score: int = 0) -> SimStep:
        assert self._task_id is not None
        v = self.variations[self._task_id]
        tree, goal, doors, actions = self._read_engine(done)
        key = state_key((v.task_type, str(v.variation), self.simplifications), tree, goal,
                        engine_score, self._pending, doors)
        return SimStep(observation, actions, key, reward=reward, terminated=done, won=won,
                       extra_info={"score": self._score, "task_type": v.task_type,
                                   "variation": v.variation})

    def _read_engine(self, done: bool) -> tuple[dict, str, list[tuple[str, bool]],
                                                  tuple[str, ...]]:
        """Object tree, goal progress, doors and (unless ``done``) the valid actions: what
        every step reads, in one order. Listing the valid actions draws from the engine's
        random generator (object descriptions), so it is never skipped or cached: with a
        cache, what happened next depended on which states had been listed before."""
        tree = self._engine.getObjectTree()
        goal = str(self._server.getGoalProgressStr())
        doors = [(label, bool(door.isOpen())) for label, door in self._doors]
        return tree, goal, doors, () if done else self._valid_actions()

    def _find_doors(self) -> list[tuple[str, Any]]:
        """(label, the engine's door properties) of every door between two rooms; the
        label names the door and the rooms it joins (the object tree has no doors)."""
        node = self._server.agent().get()
        while node.getContainer().isDefined():
            node = node.getContainer().get()
        doors: dict[int, tuple[str, Any]] = {}
        rooms = node.getContainedObjects(False).toList()
        for i in range(rooms.size()):
            portals = rooms.apply(i).getPortals(False).toList()
            for j in range(portals.size()):
                door = portals.apply(j)
                rooms_joined = sorted([str(door.connectsFrom().name()),
                                       str(door.connectsTo().name())])
                doors[int(door.uuid())] = (f"{door.name()}:{'|'.join(rooms_joined)}",
                                           door.propPortal().get())
        return sorted(doors.values(), key=lambda d: d[0])

    def _valid_actions(self) -> tuple[str, ...]:
        """The engine's valid action-object combinations, fetched as one string (one call
        to the JVM instead of one per action, as the package's ``list()`` makes: 14-28 ms
        vs 80-92 ms for 2,375 actions of a genetics state, measured side by side)."""
        listed = self._server.getValidActionObjectCombinations()
        count = int(listed.size())
        text = str(listed.toString())[1:-1]
        items = text.split(", ") if count else []
        if len(items) != count:  # an action with ", " in it: fetch one by one
            items = [str(a) for a in listed]
        return tuple(sorted(set(items)))

    # ------------------------------------------------------------- expert
    def _follow_plan(self, action: str, before: str, after: str, answered: bool) -> None:
        """Keep the gold path while the agent follows it or changes nothing; an answer to
        the engine's which-object question never counts as a departure."""
        if self._plan and self._plan[0] == action:
            self._plan.pop(0)
        elif before != after and not answered:
            self._plan = None
        self._fresh = False

    def expert_action(self) -> str | None:
        """The next gold action, or ``None`` after a departure (no replanning). The gold
        path is made on the episode's first call (it must come at its start)."""
        if self._last is None:
            raise RuntimeError("call reset() before expert_action()")
        if self._plan is None and self._fresh and self._task_id not in self._gold:
            self._gold[self._task_id] = self._make_gold(self._task_id)
            self._plan = list(self._gold[self._task_id])
        return gold_action(self._plan, bool(self._pending)) if self._plan else None

    def _make_gold(self, task_id: int) -> tuple[str, ...]:
        """The engine's gold action sequence, checked by playing it: in the task types with
        random dynamics (pollination, genetics) the engine's recording may not replay, and
        a new one is asked for (up to ``GOLD_TRIES`` times). Leaves the world at its start."""
        v = self.variations[task_id]
        recordings = []
        for _ in range(GOLD_TRIES):
            self._server.load(v.task_type, v.variation, self.simplifications, True)
            recordings.append(tuple(normalize_action(a)
                                    for a in self._server.getGoldActionSequence()))
            self._load(task_id)
            self._read_engine(done=False)  # as the reset does
            if self._replays(recordings[-1]):
                gold = recordings[-1]
                break
        else:
            gold = recordings[0]
        self._load(task_id)  # the episode's start again (the same world: see _load)
        return gold

    def _replays(self, gold: tuple[str, ...]) -> bool:
        """Whether ``gold`` wins from the loaded start, read step by step as the env does."""
        plan, pending = list(gold), False
        for _ in range(len(gold) * 2):
            action = gold_action(plan, pending)
            if action is None:
                return False
            observation = str(self._server.step(action))
            if observation.startswith(REJECTED):
                return False
            if plan and plan[0] == action:
                plan.pop(0)
            pending = observation.startswith(AMBIGUOUS)
            if self._server.getCompleted() or self._server.getScore() < 0:
                return self._server.getScore() >= 1.0
            self._read_engine(done=False)  # as the env's step does
        return False

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        super().close()
