"""The collector's configuration, in small frozen sections, one a job:

- :class:`EnvSpec`: which env (its id and kwargs);
- :class:`HostSettings`: where its episodes run (worker processes, this process, env
  servers) and how many at once, how long a host may take, when a worker is recycled;
- :class:`StepScoring`: how a step's reward and invalid-action penalty are formed, and
  which NLL GACA weighs;
- the prompts: :class:`~gaca_agent.generate.prompts.PromptBuilder` (history and template).

:class:`EnvSection` is ``gaca-train``'s ``env:`` section with its flat YAML keys (every
other caller, ``gaca-eval`` and the benchmarks, builds one too); it hands each part of
the collector the section it needs (``spec``, ``hosts``, ``scoring``, ``prompts``).
The run's own keys (held-out kwargs and episodes, groups, group size, replays) stay on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gaca_agent.generate.prompts import PromptBuilder, verl_format_valid


@dataclass(frozen=True)
class EnvSpec:
    """Which env: a Gymnasium id and the kwargs every env of it is made with."""

    id: str
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HostSettings:
    """Where an env's episodes run and how many at once (the ``env.`` keys of these names)."""

    workers: int = 1
    max_live_envs: int = 64
    servers: tuple[str, ...] = ()
    recycle_after: int | None = 100
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        bad = [u for u in self.servers if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"env.servers must be http(s):// URLs, got {bad}")
        if self.max_live_envs < 1:
            raise ValueError("env.max_live_envs must be >= 1")
        if self.workers < 0:
            raise ValueError(f"env.workers must be >= 0 (0: envs in this process), got "
                             f"{self.workers}")
        if self.timeout_s <= 0 or (self.recycle_after is not None and self.recycle_after < 1):
            raise ValueError("need env.timeout_s > 0 and env.recycle_after >= 1 (or null)")


@dataclass(frozen=True)
class StepScoring:
    """How a step is scored: its reward, its invalid-action penalty, its NLL span."""

    invalid_penalty: float = -0.1
    invalid_definition: Literal["admissible", "format"] = "admissible"
    penalty_mode: Literal["reward", "row"] = "reward"
    reward: Literal["env", "success"] = "env"
    reward_scale: float = 1.0
    nll_span: Literal["response", "action", "think"] = "response"

    def __post_init__(self) -> None:
        if self.reward_scale <= 0:
            raise ValueError(f"env.reward_scale must be > 0, got {self.reward_scale}")

    def score(self, env_reward: float, won: bool, action_valid: bool,
              response: str) -> tuple[float, float]:
        """A step's (reward, row penalty): the env's reward (1 on a win and 0 otherwise with
        ``reward: success``) times ``reward_scale``; an invalid step's penalty joins that
        reward (``penalty_mode: reward``) or is the row's own (``row``: it shifts only the
        row's episode score and return-to-go, after discounting)."""
        base = (float(won) if self.reward == "success" else float(env_reward)) \
            * self.reward_scale
        invalid = not verl_format_valid(response) if self.invalid_definition == "format" \
            else not action_valid
        penalty = self.invalid_penalty if invalid else 0.0
        if self.penalty_mode == "reward":
            return base + penalty, 0.0
        return base, penalty


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
    """Env worker processes (0: the envs run in the trainer's own process)."""
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
    processes (``workers`` and ``recycle_after`` then do not apply). Token:
    ``$GACA_ENV_TOKEN``."""
    recycle_after: int | None = 100
    """Resets after which a worker process is replaced (once none of its envs is
    mid-episode): ALFWorld processes grow with every new game. None: never."""
    timeout_s: float = 600.0
    """How long one reset or step of a worker (or env server) may take before its
    episodes are marked failed."""
    rerun_lost: int = 0
    """An episode whose env host was lost (a worker process, a Ray actor or its node, an
    env server's session) is played again from its seed, up to this many times, instead
    of being kept as failed; with a policy keyed by the episode's seed (every gaca
    policy) its actions and rewards are then those of a run without the fault (its
    log-probs to float rounding: a replayed turn shares another padded batch)."""

    def __post_init__(self) -> None:
        self.hosts, self.scoring  # noqa: B018 - their own range checks, named by env.* key
        if self.groups < 1 or self.group_size < 1:
            raise ValueError("env.groups and env.group_size must be >= 1")
        if self.rerun_lost < 0:
            raise ValueError(f"env.rerun_lost must be >= 0, got {self.rerun_lost}")
        if self.history_length < 0:
            raise ValueError(f"env.history_length must be >= 0, got {self.history_length}")
        if self.eval_episodes != "all" and int(self.eval_episodes) < 1:
            raise ValueError(f"env.eval_episodes must be 'all' or >= 1, got {self.eval_episodes}")

    @property
    def spec(self) -> EnvSpec:
        """The training env (``id``, ``kwargs``)."""
        return EnvSpec(self.id, dict(self.kwargs))

    @property
    def hosts(self) -> HostSettings:
        return HostSettings(self.workers, self.max_live_envs, tuple(self.servers),
                            self.recycle_after, self.timeout_s)

    @property
    def scoring(self) -> StepScoring:
        return StepScoring(self.invalid_penalty, self.invalid_definition, self.penalty_mode,
                           self.reward, self.reward_scale, self.nll_span)

    @property
    def prompts(self) -> PromptBuilder:
        return PromptBuilder(self.history_length, self.template_file)
