"""Declarative registration of every ``gaca/`` id (entry points are strings, so heavy
dependencies load only on ``gymnasium.make``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class EnvSpec:
    id: str
    entry_point: str
    max_episode_steps: int | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Python modules the environment needs beyond gymnasium and numpy.
    requires: tuple[str, ...] = ()


SPECS: tuple[EnvSpec, ...] = (
    EnvSpec("gaca/ALFWorld-v0", "gaca_envs.alfworld.env:ALFWorldEnv", 50,
            requires=("alfworld", "textworld")),
    EnvSpec("gaca/TextWorld-v0", "gaca_envs.alfworld.env:TextWorldEnv", 50,
            requires=("textworld",)),
    EnvSpec("gaca/WebShop-v0", "gaca_envs.webshop.env:WebShopEnv", 15,
            requires=("bm25s", "Stemmer", "thefuzz", "spacy")),
    EnvSpec("gaca/WebShopBrowser-v0", "gaca_envs.webshop.browser:WebShopBrowserEnv", 15,
            requires=("bm25s", "Stemmer", "thefuzz", "spacy", "selenium", "flask", "bs4")),
    # 100: the scienceworld package's default step limit (ScienceWorldEnv(envStepLimit=100))
    EnvSpec("gaca/ScienceWorld-v0", "gaca_envs.scienceworld.env:ScienceWorldEnv", 100,
            requires=("scienceworld",)),
    EnvSpec("gaca/Diag-Corridor-v0", "gaca_envs.diag.env:DiagEnv", 40,
            kwargs={"world": "corridor"}),
    EnvSpec("gaca/Diag-Signs-v0", "gaca_envs.diag.env:DiagEnv", 40,
            kwargs={"world": "signs"}),
    EnvSpec("gaca/Diag-SignsLong-v0", "gaca_envs.diag.env:DiagEnv", 60,
            kwargs={"world": "signs_long"}),
    EnvSpec("gaca/Diag-Slippery-v0", "gaca_envs.diag.env:DiagEnv", 40,
            kwargs={"world": "slippery"}),
    EnvSpec("gaca/Diag-Pivots-v0", "gaca_envs.diag.env:DiagEnv", 60,
            kwargs={"world": "pivots", "level": 2}),
    EnvSpec("gaca/Diag-Keys-v0", "gaca_envs.diag.env:DiagEnv", 40,
            kwargs={"world": "keys", "level": 3}),
    # remote envs: the server's env keeps its own time limit, so none is added here
    EnvSpec("gaca/Remote-v0", "gaca_envs.remote.client:RemoteEnv", None,
            requires=("websockets",)),
    EnvSpec("gaca/AgentGym-v0", "gaca_envs.remote.agentgym:AgentGymEnv", None,
            requires=("requests",)),
)


def register_all() -> None:
    """Register every spec once (idempotent)."""
    for spec in SPECS:
        if spec.id not in gym.registry:
            # gymnasium 1.4's passive checker breaks an env whose first reset raised (its
            # first step then fails); tests/test_contract.py runs the full check_env instead
            gym.register(id=spec.id, entry_point=spec.entry_point,
                         max_episode_steps=spec.max_episode_steps, kwargs=dict(spec.kwargs),
                         disable_env_checker=True)


def spec_of(env_id: str) -> EnvSpec:
    for spec in SPECS:
        if spec.id == env_id:
            return spec
    raise KeyError(f"unknown gaca env {env_id!r}; valid: {[s.id for s in SPECS]}")
