"""A plain gymnasium env for the collector tests, made in worker processes by its id
``collect_probe:gaca-test/Stall-v0`` (gymnasium imports this module there): ``stall``
sleeps for a minute (a worker that stops answering), ``explode`` raises, ``finish`` ends
the episode won with a partial score, ``lose`` ends it lost with an env reward of 0.5,
``broken`` ends it with an ``error`` in its info.
It has no state keys, no ``action_valid`` and no expert. Its reset info reports
:data:`MARK` as this process sees it (a spawned worker imports this module afresh)."""

from __future__ import annotations

import time

import gymnasium as gym

from gaca_envs.core import TextSpace

MARK = 0


class Stall(gym.Env):
    def __init__(self, build_s: float = 0.0) -> None:
        time.sleep(build_s)  # a slow start (``build_s``): imports, loading games
        self.observation_space = self.action_space = TextSpace(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "ready", {"admissible_actions": ["stall", "explode", "finish", "lose", "broken"],
                         "mark": MARK}

    def step(self, action):
        if action == "stall":
            time.sleep(60)
        if action == "explode":
            raise RuntimeError("the probe env exploded")
        if action == "lose":
            return "lost", 0.5, True, False, {"won": False}
        if action == "broken":
            return "the engine broke", 0.0, True, False, {"error": "engine broke"}
        return "done", 1.0, True, False, {"won": True, "score": 0.75}


if "gaca-test/Stall-v0" not in gym.registry:
    gym.register("gaca-test/Stall-v0", entry_point=Stall)
