"""``gaca-train``'s configuration sections: frozen dataclasses whose fields carry their
documentation and whose ``__post_init__`` checks their ranges. The env section is the
collector's own configuration (:mod:`gaca_agent.collect.settings`), the YAML's ``env:``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from gaca_agent.collect.settings import EnvSection
from gaca_agent.generate.factory import EngineName
from gaca_agent.learner.config import LearnerConfig
from gaca_agent.policies import EVAL_TEMPERATURE

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ModelSection:
    path: str = "tiny"
    """``tiny`` (built in-process), ``smollm2``, or a transformers checkpoint path."""
    max_new_tokens: int = 32
    temperature: float = 1.0
    """Rollout temperature (GiGPO: 1.0)."""
    eval_temperature: float = EVAL_TEMPERATURE
    """Validation temperature (GiGPO: 0.4; gaca-eval's default too)."""
    max_prompt_tokens: int | None = None
    """Longer prompts keep their end (the newest observation) and lose their beginning."""
    engine: EngineName = "hf"
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
    """The inference server of ``model.engine: server`` (gaca_agent/generate/server_engine.py)."""

    base_url: str = ""
    """The server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1``."""
    replicas: tuple[str, ...] = ()
    """More servers of the same model (their API roots): each episode stays on one server,
    new episodes go to the server with the fewest requests in flight, a server that stops
    answering is dropped and its turns go to the others; every weight sync and probe goes
    to each server still up (gaca_agent/generate/server_group.py)."""
    model: str = ""
    """The base model's served name (vLLM's ``--served-model-name``, else its path): the
    same weights as ``model.path``, which the learner trains."""
    kind: Literal["vllm", "sglang"] = "vllm"
    """The server's API: vLLM (0.33.0) or SGLang (0.5.23), the versions this client was
    checked against (docs/training.md, "Rolling out with vLLM or SGLang"); gaca-serve speaks
    both."""
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
    (gaca_agent/generate/probe.py); beyond it the run stops naming the server flag to fix."""
    probe_tokens: int = 16
    sync_dtype: Literal["float32", "bfloat16"] = "float32"
    """Full fine-tuning: the dtype of the weights sent to the server (bf16 halves the
    bytes; the server casts to its own dtype either way)."""
    weight_transfer: Literal["disk", "broadcast"] = "disk"
    """Full fine-tuning: ``disk`` writes the weights under ``weights/vN`` for the server to
    load (any server that can read the folder); ``broadcast`` sends them over
    ``torch.distributed`` (NCCL on GPUs, gloo on CPUs) through SGLang's distributed update
    API (gaca-serve speaks it) or vLLM's weight-transfer engine, in buckets, no disk."""
    bucket_mb: int = 1024
    """Broadcast bucket size in MiB (AReaL and ROLL: 1 GiB; slime: 512 MiB)."""
    transfer_timeout_s: float = 600.0
    """The bound on every collective of the broadcast: a peer that stalls stops the run."""
    transfer_host: str = "127.0.0.1"
    """The learner's address as the inference server reaches it (the rendezvous host)."""
    transfer_port: int = 0
    """The rendezvous port (0: a free one; with ``replicas``, server i uses this + i)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.timeout_s <= 0 or self.retries < 0:
            raise ValueError("need server.concurrency >= 1, server.timeout_s > 0 and "
                             "server.retries >= 0")
        if self.probe_tolerance <= 0 or self.probe_tokens < 1:
            raise ValueError("need server.probe_tolerance > 0 and server.probe_tokens >= 1")
        bad = [u for u in self.replicas if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"server.replicas must be http(s):// URLs, got {bad}")
        if self.bucket_mb < 1 or self.transfer_timeout_s <= 0 or self.transfer_port < 0:
            raise ValueError("need server.bucket_mb >= 1, server.transfer_timeout_s > 0 and "
                             "server.transfer_port >= 0")


@dataclass(frozen=True)
class AlgoSection:
    estimator: str = "gaca"
    """Any registered estimator: grpo, rloo, reinforce_pp, gigpo, gaca, adastep, pgpo,
    graft, empg, ecpo, ecpo_scaled, shrink, spread (docs/algorithms.md)."""
    params: dict = field(default_factory=lambda: {"gamma": 0.95, "omega": 1.0})
    """Estimator parameters (the names of docs/algorithms.md)."""
    anchor: Literal["state", "observation"] = "state"
    """Anchor states of step-level estimators: ``state`` (ours) the canonical state key;
    ``observation`` (GiGPO's/verl-agent's) the exact observation text."""
    filter_groups: bool = False
    """Train only on the task groups whose episodes' returns differ (DAPO's filter; the
    estimator still sees every group). The others' rows are neither forwarded nor put in
    the KL term; ``train/filtered_rows_frac`` says how many were left out."""


@dataclass(frozen=True)
class WarmupSection:
    bc_steps: int = 0
    """Behaviour-cloning steps on transcripts of ``source``'s episodes, each step's prompt
    exactly as RL builds it (chat template, history) and its action as the response;
    each step takes ``bc_batch`` pairs from shuffled passes over all of them, so
    ``bc_steps x bc_batch / pairs`` is the number of epochs (``warmup/epochs``). 0 skips
    the warm-up."""
    source: Literal["random", "expert"] = "random"
    """``random``: uniform admissible actions, the response format only (no success
    signal); ``expert``: the env's expert (ALFWorld's planner, ScienceWorld's gold path,
    TextWorld's walkthrough, WebShop's expert): supervised fine-tuning on its trajectories,
    on ``bc_episodes`` train tasks spread evenly over the split (gaca-eval's plan: every
    task type of a split sorted by type); random transcripts play the first tasks."""
    bc_batch: int = 16
    bc_lr: float = 3e-3
    bc_episodes: int = 64
    eval_before: bool = False
    """Also evaluate on the held-out episodes before the warm-up (``eval_before/*`` in the
    warm-up's metrics row): zero-shot, after the warm-up and after RL from one run."""
    env_kwargs: dict[str, Any] | None = None
    """Env kwargs for the warm-up's episodes, over ``env.kwargs`` (the keys it names are
    replaced): tasks the warm-up trains on that RL never draws, e.g. other generated
    TextWorld games. None: the warm-up plays the training env's tasks."""

    def own_env_kwargs(self, env_kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The kwargs the warm-up plays on when it has its own (``env_kwargs`` over the
        training env's) and runs at all; None when it plays the training env's tasks."""
        if self.env_kwargs is None or self.bc_steps <= 0:
            return None
        return {**env_kwargs, **self.env_kwargs}

    def __post_init__(self) -> None:
        if self.bc_steps < 0 or self.bc_batch < 1 or self.bc_episodes < 1 or self.bc_lr <= 0:
            raise ValueError("need warmup.bc_steps >= 0, warmup.bc_batch >= 1, "
                             "warmup.bc_episodes >= 1 and warmup.bc_lr > 0")
        if self.source not in ("random", "expert"):
            raise ValueError(f"warmup.source must be random or expert, got {self.source!r}")


@dataclass(frozen=True)
class ClusterSection:
    """Where the env workers, inference servers and learner ranks run (docs/cluster.md)."""

    backend: Literal["local", "ray"] = "local"
    """``local``: worker processes of this machine (``env.workers``); ``ray``: Ray actors
    placed over the cluster's nodes, each running the same env code as a worker process
    (``pip install -e '.[ray]'``)."""
    address: str = ""
    """``ray``: the cluster to join (``auto``: the one ``ray start`` made on this node;
    ``ray://HOST:10001``: a remote one); empty: start a Ray on this machine."""
    env_actors: int = 0
    """``ray``: env actors, each holding several env slots as a worker process does
    (0: ``env.workers``)."""
    env_cpus: float = 1.0
    """CPUs each env actor reserves."""
    env_memory_mb: int = 0
    """Memory each env actor reserves (ScienceWorld's JVMs, WebShop's index); 0: none."""
    env_resources: dict = field(default_factory=dict)
    """Custom resources each env actor needs, e.g. ``{webshop_index: 1}`` for nodes started
    with ``ray start --resources '{"webshop_index": 4}'``."""
    object_store_mb: int = 512
    """A Ray started here: its object store (Ray's default takes 30% of the memory)."""
    servers: int = 0
    """``ray`` with ``model.engine: server``: inference servers Ray starts, spread over
    the nodes with ``server_resources`` (0: the servers in ``server.base_url`` and
    ``server.replicas`` are yours)."""
    server_command: str = "gaca-serve {model} --name {name} --host {host} --port {port}"
    """How a server starts on its node: ``{model}`` (``model.path``, readable there),
    ``{name}`` (``server.model``), ``{host}`` (the node's address), ``{port}`` (a free
    one); the key made for the run, which its clients send, is in the server's
    environment (``GACA_SERVE_API_KEY``, ``VLLM_API_KEY``), or ``{api_key}`` for a server
    that takes it only as a flag (SGLang: ``--api-key {api_key}``); e.g. ``vllm serve
    {model} --served-model-name {name} --host {host} --port {port} --enable-lora``."""
    server_resources: dict = field(default_factory=dict)
    """What each server needs, e.g. ``{GPU: 1}`` (or a tensor-parallel group's)."""
    server_cpus: float = 1.0
    server_start_timeout_s: float = 900.0
    """How long a server may take to answer ``/health`` (loading the model)."""
    learners: int = 0
    """``ray``: learner ranks Ray places and starts, each running this ``gaca-train`` as
    ``torchrun`` would (docs/cluster.md, "Learner ranks"); 0: this process is the learner
    (or ``accelerate launch``'s ranks are)."""
    learner_cpus: float = 1.0
    learner_gpus: int = 0
    """GPUs each learner rank takes (1 on GPU nodes)."""
    learner_resources: dict = field(default_factory=dict)
    """Custom resources each learner rank needs."""
    learner_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """How the ranks' bundles are placed (Ray's placement-group strategies)."""
    learner_start_timeout_s: float = 300.0
    """How long the cluster may take to find room for every rank."""

    def __post_init__(self) -> None:
        if self.env_actors < 0 or self.env_cpus <= 0 or self.env_memory_mb < 0 \
                or self.object_store_mb < 75:
            raise ValueError("need cluster.env_actors >= 0, cluster.env_cpus > 0, "
                             "cluster.env_memory_mb >= 0 and cluster.object_store_mb >= 75 "
                             "(Ray's smallest object store)")
        if self.servers < 0 or self.server_cpus < 0 or self.server_start_timeout_s <= 0:
            raise ValueError("need cluster.servers >= 0, cluster.server_cpus >= 0 and "
                             "cluster.server_start_timeout_s > 0")
        if self.learners < 0 or self.learner_cpus < 0 or self.learner_gpus < 0 \
                or self.learner_start_timeout_s <= 0:
            raise ValueError("need cluster.learners >= 0, cluster.learner_cpus >= 0, "
                             "cluster.learner_gpus >= 0 and cluster.learner_start_timeout_s > 0")
        if self.learners and not (self.learner_cpus or self.learner_gpus
                                  or any(self.learner_resources.values())):
            raise ValueError("a learner rank must ask for something (Ray refuses an empty "
                             "bundle): cluster.learner_cpus, learner_gpus or "
                             "learner_resources")
        for part in ("servers", "learners"):
            if getattr(self, part) and self.backend != "ray":
                raise ValueError(f"cluster.{part} are started by Ray: set cluster.backend: ray")


@dataclass(frozen=True)
class TrainConfig:
    name: str = "default"
    seed: int = 0
    iterations: int = 20
    eval_every: int = 5
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    out_dir: str = "runs"
    max_staleness: int = 0
    """Asynchronous training (docs/training.md, "Asynchronous training"): the rollouts of
    iteration j are sampled by the weights of update j - K while the learner trains on
    earlier ones; 0 is the lock-step loop. K >= 1 needs ``model.engine: server`` and
    ``learner.old_logprobs: recompute`` (add ``learner.tis_cap`` for the decoupled
    objective's importance weights)."""
    partial_rollouts: bool = False
    """With ``max_staleness`` >= 1: each turn uses the newest synced weights, so an episode
    may span versions (each step records its own); off, every episode of iteration j plays
    on version j - K from start to end (reproducible, and resumed exactly)."""
    keep_rollouts: bool | Literal["tokens"] = True
    """Write every iteration's episodes to ``rollouts/`` (for ``gaca-rescore`` and
    ``gaca-export``); ``tokens`` adds each step's token ids and sampled log-probs; turn
    off to save disk (ALFWorld at GiGPO's scale: about 2 MB an iteration, gzipped)."""
    logging: tuple[Literal["tensorboard", "wandb", "trackio"], ...] = ("tensorboard",)
    """Trackers beside ``metrics.jsonl`` (any subset; the same metric names in each)."""
    project: str = "gaca"
    """The W&B / Trackio project the run is logged to (its name is ``name``)."""
    env: EnvSection = field(default_factory=EnvSection)
    model: ModelSection = field(default_factory=ModelSection)
    algo: AlgoSection = field(default_factory=AlgoSection)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    warmup: WarmupSection = field(default_factory=WarmupSection)
    server: ServerSection = field(default_factory=ServerSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)

    def __post_init__(self) -> None:
        from gaca_agent.advantages import make_config

        from gaca_agent.config.rules import check_server_setting, check_staleness, tie_temperature

        make_config(self.algo.estimator, **self.algo.params)  # validates name and params
        if not _NAME_RE.match(self.name) or ".." in self.name:
            raise ValueError(f"name must be a plain folder name (letters, digits, '_', '-', "
                             f"'.'), got {self.name!r}: the run is written to out_dir/name")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.eval_every < 0 or self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ValueError("need eval_every >= 0, checkpoint_every >= 0, keep_checkpoints >= 1")
        tie_temperature(self)
        if self.model.engine == "server":
            check_server_setting(self)
        check_staleness(self)
        if self.cluster.backend == "ray" and self.env.servers:
            raise ValueError("cluster.backend: ray places env workers itself; env.servers "
                             "are env servers you started: use one or the other")


#: The sections of :class:`TrainConfig` by key.
SECTIONS = {"env": EnvSection, "model": ModelSection, "algo": AlgoSection,
            "learner": LearnerConfig, "warmup": WarmupSection, "server": ServerSection,
            "cluster": ClusterSection}
