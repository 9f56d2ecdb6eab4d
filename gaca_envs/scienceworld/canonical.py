"""Canonical state keys from ScienceWorld's true state: the engine's object tree.

The engine exports its whole world as a tree (``getObjectTree``): every object with its
name, its properties (material and temperature, state of matter, container open/closed,
device on/off, life, electrical connections) and its contents, the agent and its inventory
included. The key hashes a canonical form of that tree plus the task's progress:

- object ids (``uuid``) are left out: the engine renumbers objects on every load, so the
  same world reached twice must not differ by them. Electrical connections name the
  object they reach by its path of names from the root instead of its id;
- children are sorted by their own canonical form, so the order the engine lists them in
  does not matter;
- the tree leaves doors out (the engine keeps them as portals between rooms, outside
  any room's contents): the env adds whether each door is open, by the two rooms it joins.
  Drains (also portals, inside sinks and bathtubs) are not in the key;
- the goal progress (which subgoals are done) and the score are part of the key: ``focus
  on`` changes the task's state without touching any object;
- temperatures enter in bins of ``TEMPERATURE_BIN_C`` degrees (rounded to the nearest
  bin). The engine's house starts out of thermal equilibrium (air at 25 C, objects at
  10 C) and every action that takes time moves every temperature a little: exact values
  would give every tick a new key, so ``examine`` and two paths of different length to
  one room would never share one. Measured over 100 ticks of ``wait1`` from the start of
  three task types, 10 C bins change the key 4-7 times, 1 C bins 69-73 times. Heating
  a pot on a stove changes the key every 10 C, and a change of state of matter at once;
- a pending ambiguity question (the engine asks which of several objects was meant and
  waits for a number) is part of the key: the admissible actions differ there.

Everything here is pure: it takes the parsed tree, so it is tested without Java.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from gaca_envs.core import stable_hash

#: Width of the temperature bins of the key, in degrees Celsius.
TEMPERATURE_BIN_C = 10.0
#: Node fields that identify the engine's object instance, not the world's state.
_ID_FIELDS = frozenset({"uuid", "contents"})


def _paths(node: dict[str, Any], prefix: str, out: dict[str, str]) -> None:
    path = f"{prefix}/{node.get('name', '')}"
    out[str(node.get("uuid"))] = path
    for child in (node.get("contents") or {}).values():
        _paths(child, path, out)


def _props(node: dict[str, Any], path_of: dict[str, str]) -> dict[str, Any]:
    props = {k: v for k, v in node.items() if k not in _ID_FIELDS}
    material = props.get("propMaterial")
    if isinstance(material, dict) and isinstance(material.get("temperatureC"), (int, float)):
        props["propMaterial"] = {**material, "temperatureC":
                                 round(material["temperatureC"] / TEMPERATURE_BIN_C)}
    wire = props.get("propElectricalConnection")
    if isinstance(wire, dict) and wire.get("connectedTo"):
        props["propElectricalConnection"] = {
            **wire, "connectedTo": sorted(path_of.get(str(u), "?") for u in wire["connectedTo"])}
    return props


def _canonical(node: dict[str, Any], path_of: dict[str, str]) -> str:
    children = sorted(_canonical(c, path_of) for c in (node.get("contents") or {}).values())
    return json.dumps([_props(node, path_of), children], sort_keys=True,
                      separators=(",", ":"))


def tree_form(tree: dict[str, Any]) -> str:
    """The canonical text of an object tree (ids replaced by paths, children sorted)."""
    path_of: dict[str, str] = {}
    _paths(tree, "", path_of)
    return _canonical(tree, path_of)


def goal_flags(goal_progress: str) -> tuple[str, ...]:
    """The lines of the engine's goal-progress report, whitespace-normalised (each says
    whether one subgoal is done)."""
    return tuple(" ".join(line.split()) for line in goal_progress.splitlines()
                 if line.strip() and not set(line.strip()) <= {"-"})


def state_key(task: Iterable[str], tree: dict[str, Any], goal_progress: str, score: int,
              pending: str = "", doors: Iterable[tuple[str, bool]] = ()) -> str:
    """The key of one ScienceWorld state: ``task`` (task name, variation, simplifications),
    the canonical tree, the doors (label, open), the goal progress, the score and any
    pending ambiguity question."""
    return stable_hash(["scienceworld", *task, tree_form(tree),
                        *(f"{label}={'open' if is_open else 'closed'}"
                          for label, is_open in sorted(doors)),
                        *goal_flags(goal_progress), f"score={score}", f"pending={pending}"])
