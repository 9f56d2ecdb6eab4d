"""Run in a fresh process by the reproducibility tests: prints what a seeded episode saw."""

import json
import sys

import gymnasium as gym

import gaca_envs

gym.register_envs(gaca_envs)


def probe(env_id: str, kwargs: dict, seed: int | None, task_id: int | None,
          actions: list[str]) -> dict:
    env = gym.make(env_id, **kwargs)
    options = {"task_id": task_id} if task_id is not None else None
    obs, info = env.reset(seed=seed, options=options)
    seen = [[obs, info["state_key"], info["task_id"]]]
    for action in actions:
        obs, reward, term, trunc, info = env.step(action)
        seen.append([obs, info["state_key"], reward])
    env.close()
    return {"seen": seen}


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(probe(**args)))
