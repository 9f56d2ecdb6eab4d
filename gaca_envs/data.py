"""Where the project finds external data and keeps its caches.

Shared data (real ALFWorld games, WebShop files) is never copied into the repository. It
is found, in order, through an explicit argument, an environment variable, the
``../shared`` folder beside the repository root, or a package's own download cache.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Overrides the location of the shared data folder (the one holding ``data/``).
SHARED_ENV_VAR = "GACA_SHARED"
#: Overrides the cache folder (translated ALFWorld games and other derived files).
CACHE_ENV_VAR = "GACA_CACHE"

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    """The shared folder: ``$GACA_SHARED``, else ``../shared`` beside the repo root or cwd."""
    env = os.environ.get(SHARED_ENV_VAR)
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT.parent / "shared", Path.cwd().parent / "shared"]
    for path in candidates:
        if (path / "data").is_dir():
            return path.resolve()
    return None


def shared_data(*parts: str) -> Path | None:
    """A path under ``<shared>/data`` if it exists, else ``None``."""
    root = shared_dir()
    if root is None:
        return None
    path = root.joinpath("data", *parts)
    return path if path.exists() else None


def cache_dir(*parts: str) -> Path:
    """A writable cache folder (``$GACA_CACHE``, else ``~/.cache/gaca``), created on use."""
    base = Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "gaca")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
