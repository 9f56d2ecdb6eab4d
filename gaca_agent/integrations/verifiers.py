"""gaca environments as a verifiers (0.4, its ``v1`` stack) taskset and environment.

verifiers loads a taskset by a top-level module name: ``gaca_verifiers`` re-exports
:class:`GacaTaskset` and :class:`GacaEnv` from here, so ``vf-eval gaca-verifiers
--env.taskset.env gaca/ALFWorld-v0`` and :func:`load_environment` both reach them.

The gaca env plays the user, host-side, as verifiers' own TextArena and OpenEnv tasksets do:
the task prompt is the first observation with its admissible actions; each reply of the
model is read as gaca's policies read it (the last ``<action>...</action>`` block) and
stepped; the next observation is the next user turn; the episode's end ends the exchange.
The player runs through verifiers' ``null`` harness (a plain chat loop) in a local
subprocess. The trace carries the return as reward ``gaca_return`` (and metrics ``won``,
``steps``, ``terminated``, ``truncated``), and in ``info`` the actions stepped and the
canonical state key after each step (``state_keys``, the reset's first).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.runtimes import SubprocessConfig

from gaca_agent.generate.prompts import parse_response
from gaca_agent.integrations.render import render

SYSTEM_PROMPT = ("You act in a text environment. Each turn shows what you observe and the "
                 "admissible actions. Think briefly, then answer with exactly one of them "
                 "as <think>...</think><action>the action</action>.")


class GacaTasksetConfig(vf.TasksetConfig):
    env: str = "gaca/Diag-Signs-v0"
    """A gaca env id (``gaca/...``) or ``module:Id``."""
    tasks: int = 8
    """How many tasks: task i resets the env with seed ``seed + i``."""
    seed: int = 0
    task_ids: list[int] = Field(default_factory=list)
    """The env's own task ids to play, one task each (then ``tasks`` is ignored)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gym.make``."""


class GacaData(vf.TaskData):
    info: dict
    """What the env reproduces the episode from: env id, seed, task id, make kwargs."""


class GacaTask(vf.Task[GacaData, vf.State, vf.TaskConfig]):
    pass


class GacaEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime=SubprocessConfig())


def make_env(info: dict) -> Any:
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    return gym.make(info["env"], **info["env_kwargs"])


def ensure_uv() -> None:
    """verifiers' ``null`` harness runs as a uv script in a subprocess that looks for uv on
    PATH and, failing that, downloads it (from astral.sh). Put the uv installed beside this
    interpreter (``scripts/setup_verifiers.sh`` installs it in ``.venv-verifiers``) on PATH
    when the venv was not activated, or say plainly that uv is missing."""
    if shutil.which("uv"):
        return
    here = Path(sys.executable).parent
    if not (here / "uv").exists():
        raise RuntimeError(f"verifiers' null harness needs uv on PATH and none was found "
                           f"(nor beside {sys.executable}): pip install uv, or run "
                           f"bash scripts/setup_verifiers.sh")
    os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


def reset(env: Any, info: dict) -> tuple[str, dict]:
    options = None if info["task_id"] is None else {"task_id": info["task_id"]}
    return env.reset(seed=info["seed"], options=options)


class GacaEnv(vf.Env[GacaEnvConfig]):
    async def run(self, task, agents):
        ensure_uv()
        info = task.data.info
        env = make_env(info)
        _, first = reset(env, info)
        ret, steps, terminated, truncated, won = 0.0, 0, False, False, False
        actions, keys = [], [first["state_key"]]
        try:
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    action, _ = parse_response(segment.last_reply)
                    obs, reward, terminated, truncated, step_info = env.step(action)
                    ret, steps = ret + float(reward), steps + 1
                    won = bool(step_info.get("won", False))
                    actions.append(action)
                    keys.append(step_info["state_key"])
                    if terminated or truncated:
                        break
                    segment = await interaction.turn(render(obs, step_info))
        finally:
            env.close()
        trace = interaction.trace
        trace.record_reward("gaca_return", ret, 1.0)
        trace.record_metrics({"won": float(won), "steps": float(steps),
                              "terminated": float(terminated), "truncated": float(truncated)})
        trace.info.update(actions=actions, state_keys=keys)


class GacaTaskset(vf.Taskset[GacaTask, GacaTasksetConfig]):
    def load(self) -> Iterator[GacaTask]:
        c = self.config
        plan = ([(c.seed + i, t) for i, t in enumerate(c.task_ids)] if c.task_ids
                else [(c.seed + i, None) for i in range(c.tasks)])
        infos = [{"env": c.env, "seed": seed, "task_id": task_id,
                  "env_kwargs": dict(c.env_kwargs)} for seed, task_id in plan]
        env = make_env(infos[0]) if infos else None  # one env resets into every task
        try:
            for info in infos:
                obs, first = reset(env, info)
                name = f"{c.env}#{info['seed']}" + (
                    "" if info["task_id"] is None else f"/task{info['task_id']}")
                yield GacaTask(GacaData(name=name, prompt=render(obs, first, task=True),
                                        system_prompt=SYSTEM_PROMPT, info=info), c.task)
        finally:
            if env is not None:
                env.close()


def load_environment(env: str = "gaca/Diag-Signs-v0", **taskset: Any) -> vf.Env:
    """A verifiers environment playing ``env`` (``taskset``: :class:`GacaTasksetConfig`'s
    other fields, e.g. ``tasks=16, seed=0``)."""
    config = GacaEnvConfig(taskset=GacaTasksetConfig(id="gaca-verifiers", env=env, **taskset))
    return GacaEnv(config)
