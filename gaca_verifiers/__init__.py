"""verifiers' plugin name for gaca: ``vf-eval gaca-verifiers`` (see
:mod:`gaca_agent.integrations.verifiers`)."""

from gaca_agent.integrations.verifiers import GacaEnv, GacaTaskset, load_environment

__all__ = ["GacaTaskset", "GacaEnv", "load_environment"]
