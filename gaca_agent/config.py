"""``gaca-train``'s typed configuration: YAML files plus ``key=value`` overrides.

Every section is a frozen dataclass whose fields carry their documentation. Loading
checks every value against its field's type (``iterations=2.5`` or ``learner.lr=fast`` is
an error naming the key) and each section's ranges; an unknown key (in the file or an
override) is an error that lists the valid keys of its section.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from gaca_agent.learner import LearnerConfig

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class EnvSection:
    id: str = "gaca/Diag-Signs-v0"
    kwargs: dict = field(default_factory=lambda: {"split": "train"})
    """Training env kwargs (tasks are drawn from this split)."""
    eval_kwargs: dict = field(default_factory=lambda: {"split": "test"})
    """Held-out evaluation env kwargs."""
    eval_episodes: int | Literal["all"] = "all"
    """Held-out episodes per evaluation: ``all`` (every task of the eval split once) or a
    number (gaca-eval's plan: fewer than the tasks are spread evenly over them)."""
    groups: int = 8
    """Task groups per iteration (GiGPO: 16)."""
    group_size: int = 8
    """Rollouts per task group, all from the same start (GiGPO: 8)."""
    workers: int = 1
    max_live_envs: int = 64
    history_length: int = 2
    template_file: str | None = None
    invalid_penalty: float = -0.1
    """The penalty of an invalid step (GiGPO: -0.1)."""
    invalid_definition: Literal["admissible", "format"] = "admissible"
    """What makes a step invalid: ``admissible`` (ours) its action was not admissible
    (which includes malformed responses); ``format`` (verl-agent's) the response lacks
    <think>/<action> tags or holds a CJK character, whatever its action."""
    penalty_mode: Literal["reward", "row"] = "reward"
    """``reward`` (ours): the penalty joins the step's reward, so it enters R_i and G_t;
    ``row`` (verl-agent's): it shifts only that row's episode score and return-to-go,
    after discounting."""
    reward: Literal["env", "success"] = "env"
    """``env``: the environment's reward (WebShop: the partial score at purchase);
    ``success``: 1 on the winning step only (verl-agent's WebShop pays only a score of 1)."""
    reward_scale: float = 1.0
    """Multiplies the reward (verl-agent/GiGPO: 10 for a success)."""
    nll_span: Literal["response", "action", "think"] = "response"
    """What a step's NLL covers for GACA: response, action or think."""
    servers: tuple[str, ...] = ()
    """URLs of ``gaca-env-serve`` servers of ``env.id`` (e.g. ``[http://envhost1:8010,
    http://envhost2:8010]``): rollouts and evaluations play there instead of in local worker
    processes (``workers`` then does not apply). Token: ``$GACA_ENV_TOKEN``."""

    def __post_init__(self) -> None:
        bad = [u for u in self.servers if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"env.servers must be http(s):// URLs, got {bad}")
        if self.groups < 1 or self.group_size < 1 or self.workers < 1 or self.max_live_envs < 1:
            raise ValueError("env.groups, env.group_size, env.workers and env.max_live_envs "
                             "must be >= 1")
        if self.reward_scale <= 0:
            raise ValueError(f"env.reward_scale must be > 0, got {self.reward_scale}")
        if self.history_length < 0:
            raise ValueError(f"env.history_length must be >= 0, got {self.history_length}")
        if self.eval_episodes != "all" and int(self.eval_episodes) < 1:
            raise ValueError(f"env.eval_episodes must be 'all' or >= 1, got {self.eval_episodes}")


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
    """Longer prompts keep their end (the newest observation) and lose their beginning."""
    engine: Literal["hf", "paged", "server"] = "hf"
    """Rollout engine: ``hf`` (generate, keyed per-episode sampling), ``paged``
    (transformers' continuous batching; see docs/benchmarks.md for which is faster) or
    ``server`` (an inference server: vLLM, SGLang or gaca-serve; see the ``server``
    section; LoRA adapters or full weights synced after every update)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or (self.max_prompt_tokens is not None
                                       and self.max_prompt_tokens < 1):
            raise ValueError("model.max_new_tokens and model.max_prompt_tokens must be >= 1")
        if self.temperature < 0 or self.eval_temperature < 0:
            raise ValueError("model.temperature and model.eval_temperature must be >= 0")


@dataclass(frozen=True)
class ServerSection:
    """The inference server of ``model.engine: server`` (gaca_agent/rollout/server.py)."""

    base_url: str = ""
    """The server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str = ""
    """The base model's served name (vLLM's ``--served-model-name``, else its path): the
    same weights as ``model.path``, which the learner trains."""
    kind: Literal["vllm", "sglang"] = "vllm"
    """The server's API: vLLM (0.33.0) or SGLang (0.5.23), the versions this client was
    checked against (README, "Rolling out with vLLM or SGLang"); gaca-serve speaks both."""
    concurrency: int = 64
    """Requests in flight at once."""
    timeout_s: float = 300.0
    retries: int = 3
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the server's API key (if it needs one)."""
    admin_api_key_env: str = "GACA_SERVER_ADMIN_KEY"
    """The environment variable holding the key of the weight-loading endpoints (SGLang's
    ``--admin-api-key``); unset: the API key."""
    probe_tolerance: float = 0.05
    """The largest mean absolute gap (nats a token) between the server's log-probs of the
    probe completion and the learner's, at start-up and after every weight sync
    (gaca_agent/rollout/probe.py); beyond it the run stops naming the server flag to fix."""
    probe_tokens: int = 16
    sync_dtype: Literal["float32", "bfloat16"] = "float32"
    """Full fine-tuning: the dtype of the weights written for the server to load (bf16
    halves the files; the server casts to its own dtype either way)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.timeout_s <= 0 or self.retries < 0:
            raise ValueError("need server.concurrency >= 1, server.timeout_s > 0 and "
                             "server.retries >= 0")
        if self.probe_tolerance <= 0 or self.probe_tokens < 1:
            raise ValueError("need server.probe_tolerance > 0 and server.probe_tokens >= 1")


@dataclass(frozen=True)
class AlgoSection:
    estimator: str = "gaca"
    """Any registered estimator: grpo, rloo, reinforce_pp, gigpo, gaca, adastep, pgpo,
    graft, empg."""
    params: dict = field(default_factory=lambda: {"gamma": 0.95, "omega": 1.0})
    """Estimator parameters (ALGORITHMS.md names)."""
    anchor: Literal["state", "observation"] = "state"
    """Anchor states of step-level estimators: ``state`` (ours) the canonical state key;
    ``observation`` (GiGPO's/verl-agent's) the exact observation text."""


@dataclass(frozen=True)
class WarmupSection:
    bc_steps: int = 0
    """Behaviour-cloning steps on transcripts of random admissible actions: teaches the
    response format only (no success signal). 0 skips the warm-up."""
    bc_batch: int = 16
    bc_lr: float = 3e-3
    bc_episodes: int = 64

    def __post_init__(self) -> None:
        if self.bc_steps < 0 or self.bc_batch < 1 or self.bc_episodes < 1 or self.bc_lr <= 0:
            raise ValueError("need warmup.bc_steps >= 0, warmup.bc_batch >= 1, "
                             "warmup.bc_episodes >= 1 and warmup.bc_lr > 0")


@dataclass(frozen=True)
class TrainConfig:
    name: str = "default"
    seed: int = 0
    iterations: int = 20
    eval_every: int = 5
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    out_dir: str = "runs"
    keep_rollouts: bool = True
    """Write every iteration's episodes to ``rollouts/`` (for ``gaca-rescore``); turn off
    to save disk (ALFWorld at GiGPO's scale: about 2 MB an iteration, gzipped)."""
    env: EnvSection = field(default_factory=EnvSection)
    model: ModelSection = field(default_factory=ModelSection)
    algo: AlgoSection = field(default_factory=AlgoSection)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    warmup: WarmupSection = field(default_factory=WarmupSection)
    server: ServerSection = field(default_factory=ServerSection)

    def __post_init__(self) -> None:
        from gaca_agent.advantages import make_config

        make_config(self.algo.estimator, **self.algo.params)  # validates name and params
        if not _NAME_RE.match(self.name) or ".." in self.name:
            raise ValueError(f"name must be a plain folder name (letters, digits, '_', '-', "
                             f"'.'), got {self.name!r}: the run is written to out_dir/name")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.eval_every < 0 or self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ValueError("need eval_every >= 0, checkpoint_every >= 0, keep_checkpoints >= 1")
        if self.model.engine == "server":
            check_server_setting(self)


def check_server_setting(cfg: "TrainConfig") -> None:
    """What ``model.engine: server`` needs, each refusal saying why."""
    if not cfg.server.base_url or not cfg.server.model:
        raise ValueError("model.engine: server needs server.base_url (the API root, e.g. "
                         "http://127.0.0.1:8000/v1) and server.model (the base model's "
                         "served name)")
    if cfg.learner.old_logprobs != "recompute":
        raise ValueError(
            "model.engine: server needs learner.old_logprobs: recompute: the server's "
            "log-probs come from other kernels than the learner's, so the learner recomputes "
            "its own (add learner.tis_cap to also correct for the difference)")
    if cfg.model.max_prompt_tokens is not None:
        raise ValueError("model.max_prompt_tokens cannot apply with model.engine: server (the "
                         "server builds the prompt's tokens); set the server's context instead")


def _build(cls, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where or 'the config'}; valid: "
                         f"{sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        sub = _SECTIONS.get(name) if cls is TrainConfig else None
        if sub is not None:
            kwargs[name] = _build(sub, value, name)
        else:
            kwargs[name] = check_type(key, value, hints[name])
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"{where + ': ' if where else ''}{err}") from None


def check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field type ``hint`` wants it (ints accepted for floats, lists for
    tuples), or a ValueError naming ``key``, the expected type and the value."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        errors = []
        for a in others:
            try:
                return check_type(key, value, a)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if len(errors) == 1 else
                         f"{key} must be {_describe(hint)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{key} must be one of {list(args)}, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    if origin is tuple or hint is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(check_type(f"{key}[{i}]", v, inner) if inner is not Any else v
                     for i, v in enumerate(value))
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ValueError(f"{key} must be a list, got {value!r}")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return value
    return value


def _describe(hint: Any) -> str:
    return " or ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(hint))


_SECTIONS = {"env": EnvSection, "model": ModelSection, "algo": AlgoSection,
             "learner": LearnerConfig, "warmup": WarmupSection, "server": ServerSection}


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
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ValueError(f"override {item!r}: the value is not valid YAML ({err})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None
                ) -> TrainConfig:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"cannot read config {path}: {err}") from None
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


def setting_rows(config: TrainConfig) -> list[tuple[str, str, str]]:
    """(setting, this config's value, verl-agent's GiGPO value) for every row of the
    paper-setting table (README, "Reproducing the papers")."""
    c, env, learner, algo = config, config.env, config.learner, config.algo
    params = algo.params
    webshop = "WebShop" in env.id
    steps = (f"1 epoch x ceil(rows / {learner.mini_batch_rows}) mini-batches"
             if learner.mini_batch_rows else
             f"{learner.ppo_epochs} epoch(s) x {learner.mini_batches} mini-batches")
    anchor = ("exact text of the current observation" if algo.anchor == "observation"
              else "canonical state key")
    if params.get("similarity") is not None:
        anchor += f", similarity >= {params['similarity']}"
    return [
        ("step-level anchor", anchor, "exact text of the current observation, similarity off"),
        ("episode-level mean/std", "over the group's step rows" if params.get(
            "episode_stats") == "steps" else "over the group's trajectories",
         "over the group's step rows"),
        ("success reward", _reward_text(env.reward, env.reward_scale, webshop),
         "10 only when the score is 1" if webshop else "10"),
        ("invalid-action penalty", f"{env.invalid_penalty:g} " + (
            "on the row's scores after discounting" if env.penalty_mode == "row"
            else "added to the step reward"), "-0.1 on the row's scores after discounting"),
        ("invalid means", "missing <think>/<action> tags or a CJK character" if
         env.invalid_definition == "format" else "an inadmissible action",
         "missing <think>/<action> tags or a CJK character"),
        ("optimizer steps per iteration", steps,
         f"1 epoch x ceil(rows / {64 if webshop else 256}) mini-batches"),
        ("PPO clip", f"{learner.clip_low:g}/{learner.clip_high:g}" + (
            f", dual-clip c = {learner.clip_ratio_c:g}" if learner.clip_ratio_c else
            ", no dual-clip"), "0.2/0.2, dual-clip c = 3"),
        ("entropy coefficient, weight decay", f"{learner.entropy_coef:g}, "
                                              f"{learner.weight_decay:g}", "0.001, 0.01"),
        ("normalization", "mean_norm" if params.get("norm") == "mean" else "mean_std_norm",
         "mean_norm" if webshop else "mean_std_norm"),
        ("WebShop data and splits" if webshop else "evaluation split",
         (f"catalogue {env.kwargs.get('catalog') or 'generated'}, train split "
          f"{env.kwargs.get('split')}") if webshop else str(env.eval_kwargs.get("split")),
         "items_shuffle_1000.json, train = goals 500+" if webshop else "valid_seen"),
        ("evaluation during training", f"{env.eval_episodes} episodes every {c.eval_every} "
                                       f"iterations, temperature {c.model.eval_temperature:g}",
         "128 episodes every 5 iterations, temperature 0.4"),
        ("rollouts and weights", _rollout_text(config),
         "vLLM, full fine-tuning (weights synced in process)"),
        ("prompts", f"{env.template_file or 'built-in'} templates (verl-agent's structure: "
                    f"no-history template at step 0), history {env.history_length}",
         "its templates, history 2, no-history template at step 0"),
    ]


def _rollout_text(config: TrainConfig) -> str:
    m, learner = config.model, config.learner
    weights = (f"LoRA r={learner.lora_r}" if learner.lora_r > 0 else "full fine-tuning")
    if m.engine != "server":
        return f"{m.engine} engine in process, {weights}"
    tis = f", TIS cap {learner.tis_cap:g}" if learner.tis_cap is not None else ""
    how = "adapter" if learner.lora_r > 0 else f"weights from disk ({config.server.sync_dtype})"
    return (f"{config.server.kind} server at {config.server.base_url}, {weights}, {how} "
            f"reloaded after each update and probed{tis}")


def _reward_text(reward: str, scale: float, webshop: bool) -> str:
    if reward == "success":
        return f"{scale:g} only when the score is 1" if webshop else f"{scale:g} on success"
    return f"{scale:g} x the score (partial credit)" if webshop else f"{scale:g}"


def describe(config: TrainConfig) -> str:
    """What ``gaca-train --dry-run`` prints: the resolved configuration as YAML, then the
    paper-setting table (this config beside verl-agent's GiGPO setting)."""
    rows = setting_rows(config)
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"  {name:<{width}}  {ours}\n  {'':<{width}}  (verl-agent: {theirs})"
                      for name, ours, theirs in rows)
    return (yaml.safe_dump(to_dict(config), sort_keys=False)
            + f"\n# setting ({config.algo.estimator}), against verl-agent's GiGPO scripts:\n"
            + table)
