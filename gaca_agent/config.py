"""``gaca-train``'s typed configuration: YAML files plus ``key=value`` overrides.

Every section is a frozen dataclass whose fields carry their documentation; an unknown
key (in the file or an override) is an error that lists the valid keys of its section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gaca_agent.learner import LearnerConfig


@dataclass(frozen=True)
class EnvSection:
    id: str = "gaca/Diag-Signs-v0"
    kwargs: dict = field(default_factory=lambda: {"split": "train"})
    """Training env kwargs (tasks are drawn from this split)."""
    eval_kwargs: dict = field(default_factory=lambda: {"split": "test"})
    """Held-out evaluation env kwargs."""
    eval_episodes: str = "all"
    groups: int = 8
    """Task groups per iteration (GiGPO: 16)."""
    group_size: int = 8
    """Rollouts per task group, all from the same start (GiGPO: 8)."""
    workers: int = 1
    max_live_envs: int = 64
    history_length: int = 2
    template_file: str | None = None
    invalid_penalty: float = -0.1
    """Added to the reward of an inadmissible action (GiGPO: -0.1)."""
    nll_span: str = "response"
    """What a step's NLL covers for GACA: response, action or think."""


@dataclass(frozen=True)
class ModelSection:
    path: str = "tiny"
    """``tiny`` (built in-process), ``smollm2``, or a transformers checkpoint path."""
    max_new_tokens: int = 32
    temperature: float = 1.0
    """Rollout temperature (GiGPO: 1.0)."""
    eval_temperature: float = 0.4
    """Validation temperature (GiGPO: 0.4)."""
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class AlgoSection:
    estimator: str = "gaca"
    """Any registered estimator: grpo, rloo, reinforce_pp, gigpo, gaca, adastep, pgpo,
    graft, empg."""
    params: dict = field(default_factory=lambda: {"gamma": 0.95, "omega": 1.0})
    """Estimator parameters (ALGORITHMS.md names)."""


@dataclass(frozen=True)
class WarmupSection:
    bc_steps: int = 0
    """Behaviour-cloning steps on transcripts of random admissible actions: teaches the
    response format only (no success signal). 0 skips the warm-up."""
    bc_batch: int = 16
    bc_lr: float = 3e-3
    bc_episodes: int = 64


@dataclass(frozen=True)
class TrainConfig:
    name: str = "default"
    seed: int = 0
    iterations: int = 20
    eval_every: int = 5
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    out_dir: str = "runs"
    env: EnvSection = field(default_factory=EnvSection)
    model: ModelSection = field(default_factory=ModelSection)
    algo: AlgoSection = field(default_factory=AlgoSection)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    warmup: WarmupSection = field(default_factory=WarmupSection)

    def __post_init__(self) -> None:
        from gaca_agent.advantages import make_config

        make_config(self.algo.estimator, **self.algo.params)  # validates name and params
        if self.env.nll_span not in ("response", "action", "think"):
            raise ValueError(f"env.nll_span must be response, action or think, got {self.env.nll_span!r}")
        if self.iterations < 1 or self.env.groups < 1 or self.env.group_size < 1:
            raise ValueError("iterations, env.groups and env.group_size must be >= 1")


def _build(cls, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where or 'the config'}; valid: "
                         f"{sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        sub = _SECTIONS.get(name) if cls is TrainConfig else None
        if sub is not None:
            kwargs[name] = _build(sub, value, name)
        elif name == "lora_targets" and isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


_SECTIONS = {"env": EnvSection, "model": ModelSection, "algo": AlgoSection,
             "learner": LearnerConfig, "warmup": WarmupSection}


def apply_override(data: dict[str, Any], item: str) -> None:
    """``a.b.c=value`` sets ``data['a']['b']['c']`` (value parsed as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ValueError(f"override {item!r} is not key=value")
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {item!r}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None
                ) -> TrainConfig:
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
    for item in overrides or []:
        apply_override(data, item)
    return _build(TrainConfig, data, "")


def to_dict(config: TrainConfig) -> dict[str, Any]:
    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}
