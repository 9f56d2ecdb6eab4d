"""The diagnostic worlds: deterministic builders from a task index to a :class:`TabularMDP`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gaca_envs.diag.mdp import Outcome, TabularMDP

COLOURS = ("red", "blue", "green", "yellow")
WALK, REST = "walk forward", "rest"
FOLLOW, OTHER = "open the door the sign shows", "open the other door"


def _rng(world: str, index: int) -> np.random.Generator:
    return np.random.default_rng([sum(map(ord, world)), index])


def corridor(index: int, length: int = 12, junctions: int = 3) -> TabularMDP:
    """A long corridor with a few pivotal doors among routine segments.

    Every segment offers ``walk forward`` (advance) and ``rest`` (stay). At ``junctions``
    segments two coloured doors replace them: the door of the task's colour advances, the
    other ends the episode in a dead end (reward 0). Walking out of the last segment
    reaches the exit (reward 1). Routine steps matter little; the doors decide everything.
    """
    rng = _rng("corridor", index)
    doors = set(rng.choice(np.arange(1, length), size=junctions, replace=False).tolist())
    target = COLOURS[int(rng.integers(len(COLOURS)))]
    states, observations, actions, outcomes = [], [], [], []
    for i in range(length):
        advance = (Outcome(1.0, i + 1, 0.0, False) if i + 1 < length
                   else Outcome(1.0, i, 1.0, True))
        where = f"Corridor, segment {i + 1} of {length}."
        states.append(f"segment-{i}")
        if i in doors:
            other = COLOURS[int(rng.choice([c for c in range(len(COLOURS))
                                            if COLOURS[c] != target]))]
            left, right = (target, other) if rng.integers(2) == 0 else (other, target)
            observations.append(f"{where} A {left} door is on the left and a {right} door "
                                "is on the right.")
            actions.append(("open the left door", "open the right door"))
            dead = Outcome(1.0, i, 0.0, True)
            outcomes.append(tuple((advance,) if c == target else (dead,) for c in (left, right)))
        else:
            observations.append(f"{where} The passage continues ahead.")
            actions.append((WALK, REST))
            outcomes.append(((advance,), (Outcome(1.0, i, 0.0, False),)))
    task = f"Reach the exit at the end of the corridor. Always open the {target} door."
    return TabularMDP("corridor", task, tuple(states), tuple(observations), tuple(actions),
                      tuple(outcomes))


def signs(index: int, length: int = 8, junctions: int = 2) -> TabularMDP:
    """A corridor whose junctions carry a sign to the door that leads on.

    Routine segments offer ``walk forward`` / ``rest``; at each junction (positions set by
    the task; the sign's side drawn when the agent walks up, probability 1/2 each) the
    agent chooses ``open the door the sign shows`` (advance) or ``open the other door``
    (dead end, reward 0). Reaching the exit gives 1. The same rule holds on every task,
    so what a policy learns on training tasks carries over to held-out ones: the CPU
    demo's world (the tiny model learns it in minutes; ``corridor``'s colour matching is
    the harder variant).
    """
    rng = _rng("signs", index)
    doors = set(rng.choice(np.arange(1, length), size=junctions, replace=False).tolist())
    states, observations, actions, outcomes = [], [], [], []
    ids: dict[tuple[int, str], int] = {}
    for i in range(length):
        for side in (("left", "right") if i in doors else ("",)):
            ids[(i, side)] = len(ids)

    def enter(i: int, reward: float = 0.0) -> tuple[Outcome, ...]:
        if i >= length:
            return (Outcome(1.0, ids[(length - 1, "")] if (length - 1, "") in ids else 0,
                            1.0, True),)
        if i in doors:
            return (Outcome(0.5, ids[(i, "left")], reward, False),
                    Outcome(0.5, ids[(i, "right")], reward, False))
        return (Outcome(1.0, ids[(i, "")], reward, False),)

    for (i, side), s in ids.items():
        where = f"Corridor, segment {i + 1} of {length}."
        if side:
            states.append(f"segment-{i}-{side}")
            observations.append(f"{where} Two doors. A sign points to the {side} door.")
            actions.append((FOLLOW, OTHER))
            outcomes.append((enter(i + 1), (Outcome(1.0, s, 0.0, True),)))
        else:
            states.append(f"segment-{i}")
            observations.append(f"{where} The passage continues ahead.")
            actions.append((WALK, REST))
            outcomes.append((enter(i + 1), (Outcome(1.0, s, 0.0, False),)))
    return TabularMDP("signs", "Reach the exit. At each door, follow the sign.", tuple(states),
                      tuple(observations), tuple(actions), tuple(outcomes))


def slippery(index: int) -> TabularMDP:
    """A river crossing with stochastic transitions.

    At the start the agent chooses the short rope bridge or the long path around. Each
    ``walk forward`` on the wet bridge slips with the task's probability (episode over,
    reward 0); the path is safe but long. Reaching the far bank gives reward 1. Returns
    after the choice differ by luck, not by the agent's later actions: the case where
    step-level (anchor-state) credit misleads.
    """
    rng = _rng("slippery", index)
    bridge = int(rng.integers(3, 6))
    path = int(rng.integers(8, 13))
    slip = float(rng.choice([0.05, 0.1, 0.15, 0.2]))
    wet = {0.05: "damp", 0.1: "wet", 0.15: "very wet", 0.2: "icy"}[slip]
    states = ["start"]
    observations = [f"You stand on the river bank. A {wet} rope bridge of {bridge} planks "
                    f"crosses here; a dry path of {path} stretches winds around."]
    actions = [("cross the bridge", "take the path")]
    outcomes: list[tuple[tuple[Outcome, ...], ...]] = [
        ((Outcome(1.0, 1, 0.0, False),), (Outcome(1.0, 1 + bridge, 0.0, False),))]
    for kind, count, p_slip in (("bridge", bridge, slip), ("path", path, 0.0)):
        first = len(states)
        for j in range(count):
            s = first + j
            last = j + 1 == count
            ok = Outcome(1.0 - p_slip, s if last else s + 1, 1.0 if last else 0.0, last)
            walk = (ok, Outcome(p_slip, s, 0.0, True)) if p_slip > 0 else (ok,)
            states.append(f"{kind}-{j}")
            place = "on the rope bridge" if kind == "bridge" else "on the path"
            observations.append(f"You are {place}, {j + 1} of {count} from the start.")
            actions.append((WALK, REST))
            outcomes.append((walk, (Outcome(1.0, s, 0.0, False),)))
    task = "Get to the far bank of the river."
    return TabularMDP("slippery", task, tuple(states), tuple(observations), tuple(actions),
                      tuple(outcomes))


def signs_long(index: int) -> TabularMDP:
    """``signs`` made harder: 14 segments with 4 junctions (random play wins 1 in 16),
    so success is rarer and the routine stretches longer."""
    return replace(signs(index, length=14, junctions=4), name="signs_long")


POINT, WARN = "points to", "warns against"


def pivots(index: int, level: int = 2, warn: bool = False) -> TabularMDP:
    """The study's world: pivotal doors among routine segments, with a difficulty knob.

    ``level`` k (1-4): a corridor of 7k segments with 2k junctions. Routine segments offer
    ``walk forward`` / ``rest``. At a junction a sign stands by one of two doors (its side
    drawn when the agent walks up) and the agent chooses ``open the door the sign shows``
    (it leads on: the ``signs`` rule) or ``open the other door`` (a dead end: episode over,
    reward 0). From level 3 the right door is sometimes jammed (it stays shut with
    probability 0.1 x (k - 2); the agent may try again): a stochastic branch. The exit
    pays 1. Random play wins 1 in 4^k before the step budget: each level adds two pivotal
    decisions among seven more segments, so successes get rarer and the routine stretches
    between the decisions longer. (``warn=True`` also makes half the signs *warn against*
    their door, so that the other door leads on: a harder rule, not used by the study.)
    """
    if level not in (1, 2, 3, 4):
        raise ValueError(f"pivots level must be 1, 2, 3 or 4, got {level}")
    rng = _rng("pivots", index)
    length, junctions, jam = 7 * level, 2 * level, 0.1 * max(0, level - 2)
    doors = set(rng.choice(np.arange(1, length), size=junctions, replace=False).tolist())
    kinds = (POINT, WARN) if warn else (POINT,)
    cases = [(kind, side) for kind in kinds for side in ("left", "right")]
    ids: dict[tuple[int, str, str], int] = {}
    for i in range(length):
        for kind, side in (cases if i in doors else [("", "")]):
            ids[(i, kind, side)] = len(ids)

    def enter(i: int) -> tuple[Outcome, ...]:
        if i >= length:
            return (Outcome(1.0, ids[(length - 1, "", "")] if (length - 1, "", "") in ids
                            else 0, 1.0, True),)
        if i in doors:
            return tuple(Outcome(1 / len(cases), ids[(i, k, sd)], 0.0, False)
                         for k, sd in cases)
        return (Outcome(1.0, ids[(i, "", "")], 0.0, False),)

    states, observations, actions, outcomes = [], [], [], []
    for (i, kind, side), s in ids.items():
        where = f"Corridor, segment {i + 1} of {length}."
        if kind:
            states.append(f"segment-{i}-{kind}-{side}")
            observations.append(f"{where} Two doors. A sign {kind} the {side} door.")
            actions.append((FOLLOW, OTHER))
            dead = (Outcome(1.0, s, 0.0, True),)
            onward = enter(i + 1)
            if jam:
                onward = tuple(replace(o, prob=o.prob * (1 - jam)) for o in onward) + (
                    Outcome(jam, s, 0.0, False),)
            good = FOLLOW if kind == POINT else OTHER
            outcomes.append(tuple(onward if a == good else dead for a in (FOLLOW, OTHER)))
        else:
            states.append(f"segment-{i}")
            observations.append(f"{where} The passage continues ahead.")
            actions.append((WALK, REST))
            outcomes.append((enter(i + 1), (Outcome(1.0, s, 0.0, False),)))
    task = ("Reach the exit. A sign either points to the door that leads on or warns "
            "against a door." if warn else "Reach the exit. At each door, follow the sign.")
    return TabularMDP(f"pivots{level}", task, tuple(states), tuple(observations),
                      tuple(actions), tuple(outcomes))


KEY_SPOTS = (
    ("A lever sticks out of the wall.", "pull the lever", "kick the lever"),
    ("A locked chest stands here.", "open the chest", "shake the chest"),
    ("A ladder leads up to a shelf.", "climb the ladder", "push the ladder"),
    ("A rope hangs from the ceiling.", "pull the rope", "cut the rope"),
    ("A small box lies on the floor.", "lift the box", "step on the box"),
    ("A bell hangs by a door.", "ring the bell", "knock on the wall"),
)
"""The keys world's junctions: what the agent sees, the action that finds the key, the
one that does not."""


def keys(index: int, level: int = 3, jam: float = 0.05) -> TabularMDP:
    """The credit study's world: many separate decisions, each paid on the spot, none
    ending the episode.

    ``level`` k (1-4): 2k junctions, each followed by a routine segment (``walk
    forward`` / ``rest``). Each junction is one of six kinds (a lever, a chest, a ladder, a
    rope, a box, a bell; drawn per task) with two actions, one of which finds the key
    (which, the agent is not told). The key pays 1 / (2k) at once (unless it is jammed,
    probability ``jam``: it stays stuck); the other action pays nothing; both lead on.
    The exit ends the episode, won when every key was taken. So every rollout meets every
    junction (GiGPO's anchor groups stay whole), a failed episode still holds right
    choices (episode-level credit blames them too), each kind is its own thing to learn,
    and a choice taken rarely at a junction can look lucky through the junctions after it
    (divergent anchor bias)."""
    if level not in (1, 2, 3, 4):
        raise ValueError(f"keys level must be 1, 2, 3 or 4, got {level}")
    rng = _rng("keys", index)
    junctions = 2 * level
    spots = [KEY_SPOTS[int(k)] for k in rng.integers(len(KEY_SPOTS), size=junctions)]
    length = 2 * junctions + 1  # junction, routine, junction, routine, ..., routine (exit)
    pay = 1.0 / junctions
    states, observations, actions, outcomes = [], [], [], []
    for i in range(length):
        where = f"Corridor, segment {i + 1} of {length}."
        last = i + 1 == length
        onward = Outcome(1.0, i, 0.0, True) if last else Outcome(1.0, i + 1, 0.0, False)
        if i % 2 == 0 and i // 2 < junctions:
            seen, right, wrong = spots[i // 2]
            states.append(f"segment-{i}-{right}")
            observations.append(f"{where} {seen}")
            actions.append((right, wrong))
            key = tuple(o for o in (Outcome(1.0 - jam, i + 1, pay, False),
                                    Outcome(jam, i + 1, 0.0, False)) if o.prob > 0)
            outcomes.append((key, (onward,)))
        else:
            states.append(f"segment-{i}")
            observations.append(f"{where} " + ("The exit is ahead." if last
                                               else "The passage continues ahead."))
            actions.append((WALK, REST))
            outcomes.append(((onward,), (Outcome(1.0, i, 0.0, False),)))
    task = ("Find the key at every stop along the corridor, then reach the exit. Each stop "
            "hides one key; only one of its two actions finds it.")
    return TabularMDP(f"keys{level}", task, tuple(states), tuple(observations),
                      tuple(actions), tuple(outcomes))


WORLDS = {"corridor": corridor, "signs": signs, "signs_long": signs_long,
          "slippery": slippery, "pivots": pivots, "keys": keys}
LEVELLED = ("pivots", "keys")
"""The worlds with a difficulty ``level``."""
