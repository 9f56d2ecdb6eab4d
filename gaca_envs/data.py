"""Where the project finds external data and keeps its caches.

External data (real ALFWorld games, WebShop's files) is never copied into the repository.
It is found through an explicit argument, an environment variable (an env's own, e.g.
``$ALFWORLD_DATA``, or ``$GACA_DATA``: one folder holding ``alfworld/`` and ``webshop/``),
or a package's own download cache. A path given explicitly (an argument or a variable that
is set) must exist: it is never silently replaced by the next place of a lookup order.
"""

from __future__ import annotations

import os
from pathlib import Path

#: A folder holding the external data sets (``alfworld/``, ``webshop/``).
DATA_ENV_VAR = "GACA_DATA"
#: Overrides the cache folder (translated ALFWorld games and other derived files).
CACHE_ENV_VAR = "GACA_CACHE"


class DataNotFound(FileNotFoundError):
    """A data path that was given explicitly does not exist (or lacks what it must hold)."""


def given_path(value: str | os.PathLike, what: str) -> Path:
    """``value`` (``~`` and variables expanded) as a path that must exist; raises
    :class:`DataNotFound` naming ``what`` (``data_dir=``, ``$GACA_DATA``) otherwise."""
    path = Path(os.path.expandvars(os.path.expanduser(str(value))))
    if not path.exists():
        raise DataNotFound(f"{what}={value}: no such folder")
    return path


def data_path(*parts: str) -> Path | None:
    """``$GACA_DATA/<parts>`` if the variable is set and the path exists, else ``None``;
    raises :class:`DataNotFound` when ``$GACA_DATA`` is set to a folder that does not
    exist."""
    root = os.environ.get(DATA_ENV_VAR)
    if not root:
        return None
    path = given_path(root, f"${DATA_ENV_VAR}").joinpath(*parts)
    return path.resolve() if path.exists() else None


def cache_dir(*parts: str) -> Path:
    """A writable cache folder (``$GACA_CACHE``, else ``~/.cache/gaca``), created on use."""
    base = Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "gaca")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
