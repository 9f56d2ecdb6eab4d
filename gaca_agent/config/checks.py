"""The input check every command runs before it creates or loads anything (and that
``--dry-run`` runs): the env id, its kwargs, the data paths, the policy and its kwargs,
the model, the servers. Each mistake is one :class:`InputError` with one line that
names it (and the nearest valid name when there is one).

The cheap checks come first (names, signatures, paths, a TCP connect); the last one
builds the env once (what finding its number of tasks needs anyway), so that a data
folder without the data, or an env that refuses its arguments, is said here too.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlparse


class InputError(ValueError):
    """A mistake in a command's inputs, said in one line before anything starts."""


#: ``gymnasium.make``'s own keywords (taken by make, not by the env).
_MAKE_KWARGS = ("max_episode_steps", "disable_env_checker", "autoreset",
                "apply_api_compatibility")
#: Env kwargs that name a file or folder (also any ``*_dir``, ``*_file``, ``*_path``).
_PATH_KWARGS = ("catalog", "attributes")


def nearest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the closest choice, or an empty string."""
    choices = list(choices)
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def env_spec(env_id: str):
    """The gymnasium spec of ``env_id`` (``module:Name-v0`` imports the module first)."""
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    name = env_id
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise InputError(f"env {env_id!r}: cannot import module {module!r} ({err})") from None
    if name not in gym.registry:
        known = sorted(gym.registry)
        gaca = ", ".join(k for k in known if k.startswith("gaca/"))
        raise InputError(f"unknown env {env_id!r}{nearest(name, known)}; the gaca envs: {gaca}"
                         + ("" if ":" in env_id else
                            "; your own: MODULE:ID, with MODULE registering ID"))
    return gym.registry[name]


def env_class(env_id: str):
    """The class (or function) that builds ``env_id``."""
    from gymnasium.envs.registration import load_env_creator

    entry = env_spec(env_id).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def check_kwargs(factory: Callable, kwargs: dict[str, Any], what: str,
                 skip: Sequence[str] = (), extra: Sequence[str] = ()) -> None:
    """Every key of ``kwargs`` is a parameter of ``factory`` (unless it takes ``**kwargs``);
    ``skip``: leading parameters the command fills itself; ``extra``: names taken besides."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    names = [n for n, p in params.items() if n not in skip and p.kind in
             (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    names += list(extra)
    for key in kwargs:
        if key not in names:
            raise InputError(f"{what} takes no {key!r}{nearest(key, names)}; it takes: "
                             f"{', '.join(names) or 'nothing'}")


def check_paths(kwargs: dict[str, Any], what: str) -> None:
    """An explicit file or folder kwarg must exist (it is never replaced by another)."""
    for key, value in kwargs.items():
        if not isinstance(value, str) or not value:
            continue
        if key in _PATH_KWARGS or key.endswith(("_dir", "_file", "_path")):
            path = Path(os.path.expanduser(value))
            if not path.exists():
                raise InputError(f"{what}: {key}={value}: no such file or folder")


def check_env(env_id: str, kwargs: dict[str, Any], *, expert: bool = False,
              local: bool = True) -> None:
    """The env id and its kwargs; for an env played here (``local``: not on env servers,
    whose machines hold their own data and packages) its paths and Python requirements."""
    spec = env_spec(env_id)
    if local:
        _check_requires(env_id)  # first: it names what to install
    try:
        factory = env_class(env_id)
    except ImportError as err:
        if local:
            raise InputError(f"env {env_id}: {err}") from None
        return  # played on env servers: this machine need not have its packages
    check_kwargs(factory, {**spec.kwargs, **kwargs}, f"env {env_id}", extra=_MAKE_KWARGS)
    if local:
        check_paths(kwargs, f"env {env_id}")
    if expert and not hasattr(factory, "expert_action"):
        raise InputError(f"--policy expert: env {env_id} has no expert (no expert_action())")


def _check_requires(env_id: str) -> None:
    from gaca_envs.registration import spec_of

    try:
        requires = spec_of(env_id).requires
    except KeyError:
        return  # not a gaca/ id: its own module said what it needs when it was imported
    missing = [m for m in requires if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"env {env_id} needs the Python modules {', '.join(missing)}"
                         " (see docs/install.md for its extra)")


def check_policy(spec: str, kwargs: dict[str, Any]) -> None:
    """The policy spec, its kwargs, and the model or server it names."""
    from gaca_agent.policies import policy_factory

    try:
        factory, args = policy_factory(spec)
    except ValueError as err:
        raise InputError(str(err)) from None
    check_kwargs(factory, kwargs, f"policy {spec}", skip=("self", "model", "base_url"))
    if spec.startswith("hf:"):
        check_model(spec[3:])
    elif spec == "smollm2":
        check_model("smollm2")
    elif spec.startswith("openai:"):
        check_url(args[0], "the policy's server")


def check_model(name: str) -> None:
    """A model folder that exists (with ``config.json``), a built-in name, or a Hub name
    the cache holds (a Hub name is refused only when nothing may be downloaded)."""
    if name == "tiny":
        return
    if name == "smollm2":
        from gaca_agent.policies.smollm2 import converted, gguf_file

        try:
            converted() or gguf_file()  # converted once, or convertible now
        except (ImportError, FileNotFoundError) as err:
            raise InputError(str(err)) from None
        return
    path = Path(os.path.expanduser(name))
    if path.exists():
        if not (path / "config.json").is_file():
            raise InputError(f"model {name}: a folder without config.json (not a "
                             "transformers checkpoint)")
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or not name.strip():
        raise InputError(f"model {name}: no such folder")
    if _offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise InputError(f"model {name}: no such folder, and not in the Hugging Face "
                             "cache (HF_HUB_OFFLINE is set: nothing can be downloaded)")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def check_url(url: str, what: str, timeout_s: float = 5.0) -> None:
    """An http(s) URL whose host accepts a TCP connection."""
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"{what}: {url!r} is not an http(s):// URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise InputError(f"{what}: cannot reach {url} ({reason}); is it running?") from None


def check_env_builds(env_id: str, kwargs: dict[str, Any],
                     servers: Sequence[str] = ()) -> int | None:
    """Build the env once (on the first server when given): its number of tasks, or
    ``None`` for an env without ``num_tasks``. What it raises becomes one line."""
    from gaca_agent.eval.evaluate import num_tasks_of

    try:
        return num_tasks_of(env_id, kwargs, servers)
    except (ValueError, TypeError, OSError, RuntimeError, ImportError, KeyError) as err:
        if os.environ.get("GACA_TRACEBACK"):
            raise
        text = " ".join(str(err).split()) or type(err).__name__
        where = f"env {env_id}" + (f" with {kwargs}" if kwargs else "")
        raise InputError(f"{where}: {text}") from None


def check_run_inputs(env_id: str, env_kwargs: Sequence[dict[str, Any]], *,
                     policy: tuple[str, dict[str, Any]] | None = None,
                     model: str | None = None, urls: Sequence[tuple[str, str]] = (),
                     servers: Sequence[str] = ()) -> None:
    """Everything a command is about to use, cheapest first; raises :class:`InputError`."""
    expert = policy is not None and policy[0] == "expert"
    for kwargs in env_kwargs:
        check_env(env_id, kwargs, expert=expert, local=not servers)
    if policy is not None:
        check_policy(*policy)
    if model is not None:
        check_model(model)
    for url, what in [*urls, *((u, "env server") for u in servers)]:
        check_url(url, what)
    for kwargs in env_kwargs:
        check_env_builds(env_id, kwargs, servers)


def check_config(cfg) -> None:
    """What a training configuration is about to use (``gaca-train`` and its ``--dry-run``)."""
    if cfg.env.template_file:
        check_paths({"template_file": cfg.env.template_file}, "env")
    missing = [k for k in cfg.logging if k != "tensorboard" and importlib.util.find_spec(k) is None]
    if missing:
        raise InputError(f"logging: {', '.join(missing)} needs the package(s) "
                         f"{', '.join(missing)} (pip install {' '.join(missing)})")
    if cfg.cluster.backend == "ray":
        check_ray(cfg.cluster.address)
    urls = []
    if cfg.model.engine == "server":  # cluster.servers: none yet (Ray starts them)
        urls = [(cfg.server.base_url, "server.base_url")] if cfg.server.base_url else []
        urls += [(u, f"server.replicas[{i}]") for i, u in enumerate(cfg.server.replicas)]
    warmup = cfg.warmup.own_env_kwargs(cfg.env.kwargs)  # the warm-up's own tasks, if any
    kwargs = [cfg.env.kwargs, cfg.env.eval_kwargs] + ([warmup] if warmup is not None else [])
    check_run_inputs(cfg.env.id, kwargs, model=cfg.model.path, urls=urls,
                     servers=cfg.env.servers)


def check_ray(address: str) -> None:
    """``cluster.backend: ray``: Ray importable, and ``cluster.address`` (when given)
    answering."""
    if importlib.util.find_spec("ray") is None:
        raise InputError("cluster.backend: ray needs Ray: pip install -e '.[ray]'")
    if address:
        from gaca_agent.cluster.ray_pool import check_reachable

        try:
            check_reachable(address, timeout_s=5.0)
        except ConnectionError as err:
            raise InputError(str(err)) from None
