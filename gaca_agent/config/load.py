"""Loading ``gaca-train``'s configuration: YAML files (a path, or the name of a config
shipped with the package) plus ``key=value`` overrides.

Loading checks every value against its field's type (``iterations=2.5`` or
``learner.lr=fast`` is an error naming the key) and each section's ranges; an unknown key
(in the file or an override) is an error that lists the valid keys of its section.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from gaca_agent.config.sections import SECTIONS, TrainConfig
from gaca_envs.kv import parse_pair

#: The configs shipped with the package (``gaca-train --config NAME``).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def config_names() -> list[str]:
    """Names of the shipped configs (``default``, ``paper/alfworld_...``)."""
    return sorted(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in
                  CONFIG_DIR.rglob("*.yaml") if "accelerate" not in p.parts)


def config_path(spec: str | Path) -> Path:
    """A config file: ``spec`` if it is a file, else the shipped config of that name
    (``default``, ``paper/alfworld_qwen2_5_1_5b_gigpo``, with or without ``.yaml``)."""
    path = Path(spec)
    if path.is_file():
        return path
    name = str(spec).removesuffix(".yaml")
    shipped = CONFIG_DIR / f"{name}.yaml"
    if ".." not in Path(name).parts and shipped.is_file():
        return shipped
    raise ValueError(f"cannot read config {spec}: no such file, and no shipped config of that "
                     f"name (shipped: {', '.join(config_names())})")


def _build(cls, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where or 'the config'}; valid: "
                         f"{sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        sub = SECTIONS.get(name) if cls is TrainConfig else None
        if sub is not None:
            kwargs[name] = _build(sub, value, name)
        else:
            kwargs[name] = check_type(key, value, hints[name])
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"{where + ': ' if where else ''}{err}") from None


def check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field type ``hint`` wants it (ints accepted for floats, lists for
    tuples), or a ValueError naming ``key``, the expected type and the value."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        errors = []
        for a in others:
            try:
                return check_type(key, value, a)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if len(errors) == 1 else
                         f"{key} must be {_describe(hint)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{key} must be one of {list(args)}, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    if origin is tuple or hint is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(check_type(f"{key}[{i}]", v, inner) if inner is not Any else v
                     for i, v in enumerate(value))
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ValueError(f"{key} must be a list, got {value!r}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return value
    return value


def _describe(hint: Any) -> str:
    """A union's values in the config's own words: ``true, false or 'tokens'``."""
    words: list[str] = []
    for a in typing.get_args(hint):
        if a is bool:
            words += ["true", "false"]
        elif a is type(None):
            words.append("null")
        elif typing.get_origin(a) is Literal:
            words += [repr(v) for v in typing.get_args(a)]
        else:
            words.append(getattr(a, "__name__", str(a)))
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def apply_override(data: dict[str, Any], item: str) -> None:
    """``a.b.c=value`` sets ``data['a']['b']['c']`` (value parsed as YAML)."""
    key, value = parse_pair(item, "override")
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {item!r}: {p} is not a section")
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None
                ) -> TrainConfig:
    """A :class:`TrainConfig` from a file (a path or a shipped config's name) and
    ``key=value`` overrides; a ValueError naming the key that is wrong."""
    data: dict[str, Any] = {}
    if path is not None:
        path = config_path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"cannot read config {path}: {err}") from None
    for item in overrides or []:
        apply_override(data, item)
    if any(o.startswith("algo.estimator=") for o in overrides or ()):
        _keep_params_of_new_estimator(data, overrides or [])
    return _build(TrainConfig, data, "")


def _keep_params_of_new_estimator(data: dict[str, Any], overrides: list[str]) -> None:
    """``algo.estimator=X`` on the command line: the file's estimator parameters that X
    does not take are dropped, and a line on stderr names them (parameters given as
    overrides, one by one or as ``algo.params=...``, are always kept, and checked)."""
    import dataclasses
    import sys

    from gaca_agent.advantages.registry import get

    if any(o.startswith("algo.params=") for o in overrides):
        return  # the command line gave the whole mapping: nothing in it is the file's
    algo = data.get("algo") or {}
    try:
        valid = {f.name for f in dataclasses.fields(get(algo.get("estimator")).config)}
    except (KeyError, ValueError, TypeError):
        return  # an unknown estimator: the config check says so
    given = {o.split("=", 1)[0].split(".")[-1] for o in overrides if o.startswith("algo.params.")}
    params = algo.get("params") or {}
    dropped = sorted(k for k in params if k not in valid and k not in given)
    if dropped:
        algo["params"] = {k: v for k, v in params.items() if k not in dropped}
        print(f"note: algo.estimator={algo['estimator']} takes no {', '.join(dropped)}: the "
              "config file's values of those are not used", file=sys.stderr)


def to_dict(config: TrainConfig) -> dict[str, Any]:
    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


