"""What a run is built from: the model path, the rollout policies (and the server engine
when ``model.engine: server``), the inference servers Ray places, the collectors, a LoRA
checkpoint's adapter."""

from __future__ import annotations

from pathlib import Path

from gaca_agent.config import TrainConfig


def resolve_model(cfg: TrainConfig, accelerator) -> str:
    if cfg.model.path == "tiny":
        from gaca_agent.policies.tiny_model import cached_tiny_model

        if accelerator.is_main_process:
            cached_tiny_model(cfg.seed)
        accelerator.wait_for_everyone()
        return str(cached_tiny_model(cfg.seed))
    if cfg.model.path == "smollm2":
        from gaca_agent.policies.smollm2 import smollm2_path

        return str(smollm2_path())
    return cfg.model.path


def load_adapter(learner, checkpoint: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(checkpoint / "model" / "adapter_model.safetensors"))
    set_peft_model_state_dict(learner.unwrapped, weights)


def make_policies(cfg: TrainConfig, learner, tokenizer):
    """(training policy, held-out policy, server engine or None) for ``model.engine``."""
    m, e = cfg.model, cfg.env
    if m.engine != "server":
        from gaca_agent.policies.hf import HFPolicy

        return (*(HFPolicy(learner.rollout_model, tokenizer, t, m.max_new_tokens,
                           e.history_length, e.template_file,
                           device=learner.accelerator.device,
                           max_prompt_tokens=m.max_prompt_tokens, engine=m.engine)
                  for t in (m.temperature, m.eval_temperature)), None)
    from gaca_agent.generate.factory import make_engine
    from gaca_agent.policies.served import ServerPolicy

    from gaca_agent.training.producer import Schedule

    engine = make_engine("server", tokenizer=tokenizer, server=cfg.server,
                         keep_versions=Schedule(cfg.max_staleness).served)
    return (*(ServerPolicy(engine, t, m.max_new_tokens, e.history_length, e.template_file)
              for t in (m.temperature, m.eval_temperature)), engine)


FLEET_KEY = "GACA_FLEET_API_KEY"
"""The environment variable holding the key of the servers Ray started (set by the run)."""


def place_servers(cfg: TrainConfig, model: str, acc):
    """(the inference servers Ray started for the run, or None; ``cfg`` with their URLs
    and key in its server section)."""
    import os
    from dataclasses import replace

    if not cfg.cluster.servers or cfg.model.engine != "server":
        return None, cfg
    from accelerate.utils import broadcast_object_list

    fleet, placed = None, [None]
    if acc.is_main_process:
        from gaca_agent.cluster.servers import Fleet

        fleet = Fleet(cfg.cluster, {"model": model, "name": cfg.server.model})
        placed = [(fleet.urls, fleet.api_key)]
    if acc.num_processes > 1:
        broadcast_object_list(placed)
    urls, key = placed[0]
    os.environ[FLEET_KEY] = key  # what this process's clients send them
    # the run as if the servers were listed (cluster.servers: 0, they are up)
    return fleet, replace(cfg, cluster=replace(cfg.cluster, servers=0),
                          server=replace(cfg.server, base_url=urls[0], replicas=tuple(urls[1:]),
                                         api_key_env=FLEET_KEY, admin_api_key_env=FLEET_KEY))


def make_collector(cfg: TrainConfig, kwargs: dict):
    """A collector of ``cfg.env`` with env kwargs ``kwargs`` (training or held-out)."""
    from dataclasses import replace

    from gaca_agent.collect.collector import Collector

    env = replace(cfg.env, kwargs=dict(kwargs))
    if cfg.cluster.backend != "ray":
        return Collector(env)
    from gaca_agent.cluster.ray_pool import ray_pool

    return Collector(env, pool=ray_pool(env.spec, env.hosts, cfg.cluster))
