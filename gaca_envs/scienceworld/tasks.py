"""ScienceWorld's task types, official splits and simplifications, in a documented order.

Task types are ordered by ScienceWorld's own task ids (``1-1`` boil, ``1-2`` melt, ...,
``10-2`` mendelian-genetics-unknown-plant: the order of the package's ``tasks.json`` and of
the paper's table); inside a type, variations ascend. A split lists, per task type, the
variation ids the engine itself assigns to ``train``, ``dev`` or ``test``
(``getVariationsTrain/Dev/Test``), never a split of our own making.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

SPLITS: tuple[str, ...] = ("train", "dev", "test")
#: ScienceWorld's individual simplification flags. Its ``easy`` preset is teleportAction,
#: openDoors, selfWateringFlowerPots and noElectricalAction, the last left out for the
#: electrical tasks (the engine's getSimplificationsUsed, read on boil and power-component).
SIMPLIFICATIONS: tuple[str, ...] = ("teleportAction", "selfWateringFlowerPots",
                                    "openContainers", "openDoors", "noElectricalAction")
_ELECTRICAL = ("power-component", "conductivity")


#: ScienceWorld's 30 task types in task-id order (the package's tasks.json, sorted by id;
#: a test checks the two agree). Plain data: the suites list them without the package.
TASK_TYPES: tuple[str, ...] = (
    "boil", "melt", "freeze", "change-the-state-of-matter-of", "use-thermometer",
    "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
    "power-component", "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity", "test-conductivity-of-unknown-substances", "find-living-thing",
    "find-non-living-thing", "find-plant", "find-animal", "grow-plant", "grow-fruit",
    "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "lifespan-longest-lived", "lifespan-shortest-lived",
    "lifespan-longest-lived-then-shortest-lived", "identify-life-stages-1",
    "identify-life-stages-2", "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces", "inclined-plane-friction-unnamed-surfaces",
    "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant")


def resolve_task_types(task_types: str | Sequence[str] | None) -> tuple[str, ...]:
    """Task names (in task-id order) from names, ScienceWorld ids (``"4-1"``) or the
    paper's names; ``None`` is every type. Raises ``ValueError`` naming the valid ones."""
    from scienceworld.utils import infer_task

    names = TASK_TYPES
    if task_types is None:
        return names
    if isinstance(task_types, str):
        task_types = [t for t in task_types.split(",") if t.strip()]
    chosen = set()
    for item in task_types:
        name = infer_task(str(item).strip())
        if name not in names:
            raise ValueError(f"unknown ScienceWorld task type {item!r}; valid: {list(names)} "
                             "(or their ids 1-1 ... 10-2)")
        chosen.add(name)
    if not chosen:
        raise ValueError("task_types is empty")
    return tuple(n for n in names if n in chosen)


def simplification_string(simplifications: str | Iterable[str] | None,
                          task_types: Sequence[str]) -> str:
    """ScienceWorld's comma-separated simplification string from ``"easy"``, a list of
    flags or a comma-separated string; checked against the engine's flags."""
    if simplifications is None:
        return ""
    items = simplifications.split(",") if isinstance(simplifications, str) \
        else list(simplifications)
    flags = [str(s).strip() for s in items if str(s).strip()]
    valid = ("easy", *SIMPLIFICATIONS)
    for flag in flags:
        if flag not in valid:
            raise ValueError(f"unknown ScienceWorld simplification {flag!r}; valid: "
                             f"{list(valid)}")
    if "noElectricalAction" in flags:
        electrical = [t for t in task_types if any(e in t for e in _ELECTRICAL)]
        if electrical:
            raise ValueError(f"simplification noElectricalAction removes the actions the "
                             f"electrical task types {electrical} need")
    return ",".join(dict.fromkeys(flags))


@dataclass(frozen=True)
class Variation:
    """One task of a split: a task type and one of its variations."""

    task_type: str
    variation: int


_SPLIT_CACHE: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}


def split_variations(server: Any, task: str) -> tuple[tuple[int, ...], ...]:
    """(train, dev, test) variation ids of ``task``, asked of a running engine (``server``:
    the package's Java ``PythonInterface``) once per process."""
    if task not in _SPLIT_CACHE:
        server.load(task, 0, "", False)
        _SPLIT_CACHE[task] = (tuple(sorted(server.getVariationsTrain())),
                              tuple(sorted(server.getVariationsDev())),
                              tuple(sorted(server.getVariationsTest())))
    return _SPLIT_CACHE[task]


def list_variations(server: Any, split: str, task_types: Sequence[str]) -> tuple[Variation, ...]:
    """Every task of ``split`` for ``task_types``: task type in task-id order, then
    variation ascending (task id ``k`` is the k-th of this list)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    index = SPLITS.index(split)
    return tuple(Variation(task, v) for task in task_types
                 for v in split_variations(server, task)[index])
