"""The rules across ``gaca-train``'s config sections, each refusal in one line: one
sampling temperature, what asynchronous training needs, what an inference server needs.
:class:`~gaca_agent.config.sections.TrainConfig` applies them when it is built."""

from __future__ import annotations

from dataclasses import replace


def tie_temperature(cfg: TrainConfig) -> None:
    """One sampling temperature: ``learner.temperature`` unset follows
    ``model.temperature``; another value is refused (the learner would recompute the
    log-probs of another distribution, every importance ratio off by their gap)."""
    if (learner := cfg.learner.temperature) is None:
        object.__setattr__(cfg, "learner", replace(cfg.learner,
                                                   temperature=cfg.model.temperature))
    elif learner != (rollout := cfg.model.temperature):
        raise ValueError(f"learner.temperature {learner:g} is not model.temperature "
                         f"{rollout:g}: the learner must recompute log-probs at the "
                         "temperature the rollouts were sampled at; remove "
                         "learner.temperature (it follows model.temperature)")


def check_staleness(cfg: TrainConfig) -> None:
    """What ``max_staleness`` >= 1 needs, each refusal in one line."""
    k = cfg.max_staleness
    if k < 0:
        raise ValueError(f"max_staleness must be >= 0 (0: lock-step), got {k}")
    if k == 0:
        if cfg.partial_rollouts:
            raise ValueError("partial_rollouts needs max_staleness >= 1 (asynchronous "
                             "training)")
        return
    if cfg.model.engine != "server":
        raise ValueError(f"max_staleness: {k} needs model.engine: server (rollouts on an "
                         "inference server while the learner trains), got model.engine: "
                         f"{cfg.model.engine}")
    if cfg.learner.old_logprobs != "recompute":
        raise ValueError(f"max_staleness: {k} needs learner.old_logprobs: recompute (the "
                         "decoupled objective's proximal policy is the learner's own pass)")
    if not cfg.learner.correction.weighted:
        raise ValueError(f"max_staleness: {k} trains on rollouts sampled by older weights and "
                         "needs an importance correction for them: add learner.tis_cap: 2 "
                         "(or learner.is_mask: [0.5, 2], learner.is_geo_mask)")


def check_server_setting(cfg: TrainConfig) -> None:
    """What ``model.engine: server`` needs, each refusal saying why."""
    if not (cfg.server.base_url or cfg.cluster.servers) or not cfg.server.model:
        raise ValueError("model.engine: server needs server.base_url (the API root, e.g. "
                         "http://127.0.0.1:8000/v1; or cluster.servers: N started by Ray) "
                         "and server.model (the base model's served name)")
    if cfg.cluster.servers and (cfg.server.base_url or cfg.server.replicas):
        raise ValueError("cluster.servers starts the inference servers itself: leave "
                         "server.base_url and server.replicas empty (or set cluster.servers: 0)")
    if cfg.learner.old_logprobs != "recompute":
        raise ValueError(
            "model.engine: server needs learner.old_logprobs: recompute: the server's "
            "log-probs come from other kernels than the learner's, so the learner recomputes "
            "its own (add learner.tis_cap to also correct for the difference)")
    if cfg.server.weight_transfer == "broadcast" and cfg.learner.lora_r > 0:
        raise ValueError("server.weight_transfer: broadcast is for full fine-tuning (LoRA "
                         "adapters are small and go through disk); set learner.lora_r: 0 "
                         "or server.weight_transfer: disk")
    if cfg.model.max_prompt_tokens is not None:
        raise ValueError("model.max_prompt_tokens cannot apply with model.engine: server (the "
                         "server builds the prompt's tokens); set the server's context instead")
