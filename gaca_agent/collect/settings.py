"""The collector's configuration: which env and kwargs, how many workers and live
episodes, the prompts' history and template, how a step's reward and penalty are formed,
and how lost hosts are handled. It is ``gaca-train``'s ``env:`` section, and every other
caller (``gaca-eval``, the benchmarks) builds one too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


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
        bad = [u for u in self.servers if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"env.servers must be http(s):// URLs, got {bad}")
        if self.groups < 1 or self.group_size < 1 or self.max_live_envs < 1:
            raise ValueError("env.groups, env.group_size and env.max_live_envs must be >= 1")
        if self.workers < 0:
            raise ValueError(f"env.workers must be >= 0 (0: envs in this process), got "
                             f"{self.workers}")
        if self.reward_scale <= 0:
            raise ValueError(f"env.reward_scale must be > 0, got {self.reward_scale}")
        if self.timeout_s <= 0 or (self.recycle_after is not None and self.recycle_after < 1):
            raise ValueError("need env.timeout_s > 0 and env.recycle_after >= 1 (or null)")
        if self.rerun_lost < 0:
            raise ValueError(f"env.rerun_lost must be >= 0, got {self.rerun_lost}")
        if self.history_length < 0:
            raise ValueError(f"env.history_length must be >= 0, got {self.history_length}")
        if self.eval_episodes != "all" and int(self.eval_episodes) < 1:
            raise ValueError(f"env.eval_episodes must be 'all' or >= 1, got {self.eval_episodes}")
