"""The one place a rollout engine is chosen: ``hf`` (transformers ``generate`` with keyed
sampling), ``paged`` (transformers' continuous batching) or ``server`` (an inference
server: vLLM, SGLang or gaca-serve). A new engine is a class with ``generate(requests)``
(in process) or ``submit(messages, ...)`` (a server) and a branch here."""

from __future__ import annotations

import os
from typing import Any, Literal

#: The engines ``model.engine`` may name.
EngineName = Literal["hf", "paged", "server"]
#: The engines that run the learner's own model in this process.
InProcess = Literal["hf", "paged"]
ENGINES: tuple[str, ...] = ("hf", "paged", "server")


def make_engine(name: str, model: Any = None, tokenizer: Any = None, device: Any = None,
                server: Any = None, **kwargs: Any):
    """The engine ``name``: over ``model`` and ``tokenizer`` in process, or, for
    ``server``, a client of the server that ``server`` (gaca-train's server section)
    describes, whose keys come from the environment variables it names."""
    if name == "hf":
        from gaca_agent.generate.engines import HFEngine

        return HFEngine(model, tokenizer, device, **kwargs)
    if name == "paged":
        from gaca_agent.generate.engines import PagedEngine

        return PagedEngine(model, tokenizer, device, **kwargs)
    if name == "server":
        from gaca_agent.generate.server_engine import ServerEngine

        if server is None:
            raise ValueError("the server engine needs the server section (base_url, model)")
        engines = [ServerEngine(url, server.model, tokenizer, server.kind,
                                os.environ.get(server.api_key_env), server.concurrency,
                                server.timeout_s, server.retries,
                                admin_api_key=os.environ.get(server.admin_api_key_env), **kwargs)
                   for url in (server.base_url, *server.replicas)]
        if len(engines) == 1:
            return engines[0]
        from gaca_agent.generate.server_group import ServerGroup

        return ServerGroup(engines)
    raise ValueError(f"unknown rollout engine {name!r}; valid: {list(ENGINES)}")
