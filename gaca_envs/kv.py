"""The one ``key=value`` parser of every command line (env kwargs, policy kwargs, config
overrides): values are YAML (``3`` an int, ``true`` a bool, ``[a, b]`` a list)."""

from __future__ import annotations

from typing import Any, Sequence


def parse_pair(item: str, what: str = "argument") -> tuple[str, Any]:
    """``key=value`` as (key, YAML value); a ValueError naming ``what`` and the item."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{what} {item!r} is not key=value")
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ValueError(f"{what} {item!r}: the value is not valid YAML ({err})") from None


def parse_pairs(items: Sequence[str] | None, what: str = "argument") -> dict[str, Any]:
    """Several ``key=value`` items as a dict (a later key wins)."""
    return dict(parse_pair(item, what) for item in items or [])
