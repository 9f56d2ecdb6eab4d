"""Finding ALFWorld data and listing its games in a fixed, documented order."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Literal

from gaca_envs.data import DataNotFound, data_path

Split = Literal["train", "valid_seen", "valid_unseen"]
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
GAME_FILE = "game.tw-pddl"


class ALFWorldDataError(DataNotFound):
    """ALFWorld's game files were not found where the lookup order says."""


@dataclass(frozen=True)
class GameRecord:
    """One ALFWorld game: its file, its task type and its name (``task_folder/trial``)."""

    path: Path
    task_type: str
    name: str


def alfworld_cache_dir() -> Path:
    """Where ``alfworld-download`` puts the data (``$ALFWORLD_DATA`` or ~/.cache/alfworld)."""
    return Path(os.path.expanduser("~/.cache/alfworld"))


def _lookup_order(data_dir: str | os.PathLike | None) -> list[tuple[str, Path | None]]:
    env = os.environ.get("ALFWORLD_DATA")
    return [
        ("data_dir argument", Path(os.path.expanduser(str(data_dir))) if data_dir else None),
        ("$ALFWORLD_DATA", Path(os.path.expandvars(os.path.expanduser(env))) if env else None),
        ("$GACA_DATA/alfworld", data_path("alfworld")),
        ("the alfworld package cache", alfworld_cache_dir()),
    ]


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The first folder of the lookup order that holds ``json_2.1.1/``.

    An explicit ``data_dir`` (or a set ``$ALFWORLD_DATA``) must hold it: the order never
    goes past a place it was told. Raises :class:`ALFWorldDataError` naming the place, or
    every place looked at and how to get the data.
    """
    order = _lookup_order(data_dir)
    for label, path in order[:2]:
        # importing alfworld sets $ALFWORLD_DATA to its own cache when unset: not a choice
        if path is not None and path.resolve() != alfworld_cache_dir().resolve():
            if (path / "json_2.1.1").is_dir():
                return path.resolve()
            raise ALFWorldDataError(
                f"ALFWorld data not found in {path} (the {label}): "
                + ("no such folder" if not path.exists() else "it has no json_2.1.1/"))
    for _, path in order:
        if path is not None and (path / "json_2.1.1").is_dir():
            return path.resolve()
    tried = "\n".join(f"  {i}. {label}: {path if path else '(not set)'}"
                      for i, (label, path) in enumerate(order, 1))
    raise ALFWorldDataError(
        "ALFWorld data not found (a folder holding json_2.1.1/ and logic/). Looked in:\n"
        f"{tried}\n"
        "Get the data with `pip install alfworld && alfworld-download` (it fills "
        "~/.cache/alfworld, or $ALFWORLD_DATA when set), or pass data_dir=PATH."
    )


def task_type_of(folder_name: str) -> str:
    """The task type a game folder name starts with (``pick_two_obj_and_place-...``)."""
    prefix = folder_name.split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task folder {folder_name!r}")
    return prefix


def list_games(data_dir: Path, split: str,
               task_types: Iterable[str] | None = None) -> tuple[GameRecord, ...]:
    """Games of ``split`` in task-id order: sorted by ``task_folder/trial`` name.

    Like ALFWorld's own loader, movable and sliced variants are skipped.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    wanted = tuple(task_types) if task_types else TASK_TYPES
    bad = [t for t in wanted if t not in TASK_TYPES]
    if bad:
        raise ValueError(f"unknown task type(s) {bad}; valid: {list(TASK_TYPES)}")
    return tuple(g for g in _all_games(Path(data_dir), split) if g.task_type in wanted)


@lru_cache(maxsize=16)
def _all_games(data_dir: Path, split: str) -> tuple[GameRecord, ...]:
    root = data_dir / "json_2.1.1" / split
    if not root.is_dir():
        raise ALFWorldDataError(f"split folder {root} does not exist")
    records = []
    for game in sorted(root.glob(f"*/*/{GAME_FILE}")):
        task_folder, trial = game.parent.parent.name, game.parent.name
        if "movable" in task_folder or "Sliced" in task_folder:
            continue
        records.append(GameRecord(game, task_type_of(task_folder), f"{task_folder}/{trial}"))
    return tuple(records)
