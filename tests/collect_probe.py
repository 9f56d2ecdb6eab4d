"""A gymnasium env for the worker-pool tests, made in worker processes by its id
``collect_probe:gaca-test/Stall-v0`` (gymnasium imports this module there): ``stall``
sleeps for a minute (a worker that stops answering), ``explode`` raises, anything else
ends the episode."""

from __future__ import annotations

import time

import gymnasium as gym

from gaca_envs.core import TextSpace


class Stall(gym.Env):
    def __init__(self) -> None:
        self.observation_space = self.action_space = TextSpace(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "ready", {"admissible_actions": ["stall", "explode", "finish"]}

    def step(self, action):
        if action == "stall":
            time.sleep(60)
        if action == "explode":
            raise RuntimeError("the probe env exploded")
        return "done", 1.0, True, False, {"won": True}


if "gaca-test/Stall-v0" not in gym.registry:
    gym.register("gaca-test/Stall-v0", entry_point=Stall)
