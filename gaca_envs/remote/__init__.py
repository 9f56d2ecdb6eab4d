"""gaca environments over the network.

- :mod:`gaca_envs.remote.wire`: what a step looks like on the wire (pure conversions).
- :mod:`gaca_envs.remote.service`: ``gaca-env-serve``, any ``gaca/`` env behind the OpenEnv
  protocol (the ``openenv`` package's server: ``/ws`` sessions, ``/reset``, ``/step``,
  ``/state``, ``/health``, ``/schema``, ``/metadata``).
- :mod:`gaca_envs.remote.client`: ``gaca/Remote-v0``, a gymnasium env backed by a server.
- :mod:`gaca_envs.remote.agentgym`: ``gaca/AgentGym-v0``, a client of AgentGym's HTTP env
  servers.
"""
