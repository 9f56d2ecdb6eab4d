"""gaca environments as TRL ``environment_factory`` classes.

``GRPOTrainer(environment_factory=trl_environment("gaca/Diag-Signs-v0"), ...)``: TRL makes
one instance per rollout with no arguments, calls ``reset(**dataset_columns)`` (its text is
appended to the prompt), exposes every other public method as a tool the model calls, and
scores the rollout with ``get_reward()`` (logged under the class's name). The class follows
TRL's documented conventions: a typed, docstringed tool, an error raised once the episode
is over (TRL feeds the message back to the model), and state on the instance for reward
functions: ``reward`` (the return so far), ``terminated`` and ``truncated`` (kept apart),
``won``, ``actions`` and ``state_keys`` (the canonical key after each step).
"""

from __future__ import annotations

import re
from typing import Any

from gaca_agent.integrations.render import render


class GacaTRLEnv:
    """The methods every ``trl_environment`` class shares (its tool is added per class)."""

    env_id: str = ""
    env_kwargs: dict[str, Any] = {}
    seed: int | None = None

    def __init__(self) -> None:
        import gymnasium as gym

        import gaca_envs

        gym.register_envs(gaca_envs)
        self.env = gym.make(self.env_id, **self.env_kwargs)
        self._resets = 0
        self._clear()

    def _clear(self) -> None:
        self.reward, self.terminated, self.truncated, self.won = 0.0, False, False, False
        self.actions: list[str] = []
        self.state_keys: list[str] = []

    def reset(self, **kwargs: Any) -> str:
        self._clear()
        row_seed = kwargs.get("seed")
        if row_seed is None and self.seed is not None:
            row_seed = self.seed + self._resets
        self._resets += 1
        task_id = kwargs.get("task_id")
        options = None if task_id is None else {"task_id": int(task_id)}
        obs, info = self.env.reset(seed=None if row_seed is None else int(row_seed),
                                   options=options)
        self.state_keys.append(info["state_key"])
        return render(obs, info, task=True)

    def _act(self, action: str) -> str:
        if self.terminated or self.truncated:
            raise ValueError("The episode is over: no more actions can be taken.")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.reward += float(reward)
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        self.won = bool(info.get("won", False))
        self.actions.append(action)
        self.state_keys.append(info["state_key"])
        text = render(obs, info)
        if terminated or truncated:
            text += "\nThe episode is over" + (" (out of time)." if truncated else ".")
        return text

    def get_reward(self) -> float:
        """The episode's return so far (TRL calls it once the rollout ends)."""
        return self.reward

    def __del__(self) -> None:
        env = self.__dict__.get("env")
        if env is not None:
            env.close()


TOOL_DOC = """Take one action in the environment.

    Args:
        action: One of the admissible actions listed in the last observation, written as
            listed.

    Returns:
        What the agent observes next, with the actions admissible then.
    """


def trl_environment(env_id: str, *, tool: str = "take_action", seed: int | None = None,
                    **env_kwargs: Any) -> type:
    """A class for TRL's ``environment_factory`` playing ``env_id`` (any ``gaca/`` id or
    ``module:Id``), made with ``env_kwargs``; its one tool is named ``tool``.

    ``reset`` reads the dataset columns ``seed`` and ``task_id`` when present; without a
    ``seed`` the n-th reset of an instance uses ``seed + n`` (``seed=None``: unseeded).
    """
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", tool) or tool in ("reset", "get_reward"):
        raise ValueError(f"tool must be a lower-case identifier other than reset and "
                         f"get_reward, got {tool!r}")

    def act(self, action: str) -> str:
        return self._act(action)

    act.__name__ = act.__qualname__ = tool
    act.__doc__ = TOOL_DOC
    name = re.sub(r"[^0-9A-Za-z]", "", env_id.split(":")[-1].split("/")[-1]) + "TRLEnv"
    return type(name, (GacaTRLEnv,), {
        "env_id": env_id, "env_kwargs": dict(env_kwargs), "seed": seed, tool: act,
        "__module__": __name__, "__doc__": f"{env_id} as a TRL environment (tool: {tool})."})
