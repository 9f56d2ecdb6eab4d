"""TextWorld games made by TextWorld's own generator, once, into a cache folder.

``gaca/TextWorld-v0`` with ``generate={"count": 64, "seed": 0, "rooms": 3, "objects": 6,
"quest_length": 3}`` plays the games :func:`generated_games` makes: game ``i`` is
TextWorld's ``make_game`` with seed ``seed + i``, so a spec names the same games on every
machine (TextWorld 1.7's generator) and two specs whose seed ranges do not overlap share
no game (a training set and a held-out set). The games are compiled (Inform 7, shipped
with TextWorld; each ``.z8`` with the ``.json`` of its facts and quests) into
``$GACA_CACHE/textworld/<spec>/`` (``~/.cache/gaca``) and reused; a folder is renamed
into place only when every game in it is written, so a process killed mid-way or another
process generating the same spec at the same time leaves no half set behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

#: What a spec may say, with the defaults (TextWorld's ``GameOptions`` names in brackets).
DEFAULTS = {"count": 64, "seed": 0, "rooms": 3,  # nb_rooms
            "objects": 6,  # nb_objects
            "quest_length": 3}


def full_spec(spec: Mapping[str, Any]) -> dict[str, int]:
    """The spec with its defaults, every value a positive int (seed: >= 0); a ValueError
    names an unknown key or a bad value."""
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"generate: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **spec}
    for key, value in out.items():
        if isinstance(value, bool) or not isinstance(value, int) or \
                value < (0 if key == "seed" else 1):
            raise ValueError(f"generate.{key} must be an integer >= "
                             f"{0 if key == 'seed' else 1}, got {value!r}")
    return out


def spec_folder(spec: Mapping[str, Any], root: Path | None = None) -> Path:
    """Where a spec's games live: a readable name and a hash of the whole spec."""
    full = full_spec(spec)
    digest = hashlib.sha1(json.dumps(full, sort_keys=True).encode()).hexdigest()[:10]
    name = (f"r{full['rooms']}-o{full['objects']}-q{full['quest_length']}"
            f"-s{full['seed']}-n{full['count']}-{digest}")
    if root is None:
        from gaca_envs.data import cache_dir

        root = cache_dir("textworld")
    return root / name


def make_one(path: Path, seed: int, rooms: int, objects: int, quest_length: int) -> Path:
    """One game, compiled to ``path`` (a ``.z8``) from TextWorld's generator."""
    import textworld
    import textworld.generator as generator

    options = textworld.GameOptions()
    options.seeds = seed
    options.nb_rooms, options.nb_objects, options.quest_length = rooms, objects, quest_length
    options.path = str(path)
    options.force_recompile = True
    return Path(generator.compile_game(generator.make_game(options), options))


def _counted(count: int, folder: Path):
    """range(count), said on stderr: one line when the games are made (about 2 s a game
    on a CPU core: minutes before a run's first row), and a bar on a terminal."""
    from tqdm import tqdm

    print(f"making {count} TextWorld games into {folder} (once; they are reused)",
          file=sys.stderr, flush=True)
    return tqdm(range(count), desc="TextWorld games", unit="game", file=sys.stderr,
                disable=None, leave=False)


def generated_games(spec: Mapping[str, Any], root: Path | None = None) -> Path:
    """The folder holding the spec's games, made first if it is not there yet."""
    full = full_spec(spec)
    folder = spec_folder(full, root)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        width = len(str(full["count"] - 1))
        for i in _counted(full["count"], folder):
            make_one(scratch / f"game-{i:0{width}d}.z8", full["seed"] + i, full["rooms"],
                     full["objects"], full["quest_length"])
        for source in scratch.glob("*.ni"):  # Inform's source; the .json is the game's
            source.unlink()                  # facts and quests, which the engine reads
        (scratch / "spec.json").write_text(json.dumps(full, sort_keys=True) + "\n")
        try:
            scratch.rename(folder)
        except OSError:  # another process finished the same spec first
            if not folder.is_dir():
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return folder
