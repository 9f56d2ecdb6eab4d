"""Multi-turn text environments for LLM agents; importing registers the ``gaca/`` ids.

>>> import gymnasium as gym, gaca_envs
>>> gym.register_envs(gaca_envs)
>>> env = gym.make("gaca/Diag-Corridor-v0")
"""

from gaca_envs.registration import SPECS, register_all

register_all()

__all__ = ["SPECS", "register_all"]
__version__ = "0.1.0"
