"""The vectorised multi-turn rollout collector.

``Collector.run(policy, tasks, group_size)`` plays ``group_size`` episodes of every
``(task_id, seed)`` in ``tasks`` (a task group: same task, same seed, same start), with
the environments in worker processes (:mod:`workers`). Each round it asks the policy for
the turns of *all* live environments at once (one batched generation), steps them in
parallel, and refills finished slots from the queue. Episodes whose worker died are kept,
marked ``failed`` with the error; nothing is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from gaca_agent.prompts import PromptBuilder, family_of
from gaca_agent.types import ActionOutput, Turn
from gaca_agent.workers import EnvPool, WorkerFailure

NllSpan = Literal["response", "action", "think"]
_SPAN_RE = {"action": re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE),
            "think": re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)}


@dataclass
class StepRecord:
    """One step of one episode (the fields of ALGORITHMS.md's notation and more)."""

    t: int
    observation: str
    admissible_actions: tuple[str, ...]
    response: str
    action: str
    format_valid: bool
    action_valid: bool
    reward: float
    env_reward: float
    state_key: str
    next_state_key: str
    terminated: bool
    truncated: bool
    nll: float = 0.0
    entropy: float | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """A whole episode; ``failed`` episodes carry the ``error`` that ended them."""

    group: int
    traj: int
    task_id: int
    seed: int | None
    task: str = ""
    steps: list[StepRecord] = field(default_factory=list)
    final_observation: str = ""
    won: bool = False
    score: float = 0.0
    failed: bool = False
    error: str = ""
    task_type: str | None = None

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)


def span_nll(output: ActionOutput, span: NllSpan) -> float:
    """Mean NLL of the tokens of a span of the response (``response``: all of them).

    Tokens are placed in the text by ``output.extra["token_offsets"]`` (character start
    of each token); a span with no tokens falls back to the whole response.
    """
    if not output.logprobs:
        return 0.0
    lp = np.asarray(output.logprobs, dtype=np.float64)
    offsets = output.extra.get("token_offsets")
    if span != "response" and offsets is not None:
        match = _SPAN_RE[span].search(output.text)
        if match:
            starts = np.asarray(offsets)
            inside = (starts >= match.start(1)) & (starts < match.end(1))
            if inside.any():
                return float(-lp[inside].mean())
    return float(-lp.mean())


@dataclass
class CollectorConfig:
    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 1
    max_live_envs: int = 64
    """Environments played at once (generation is batched across them)."""
    history_length: int = 2
    template_file: str | None = None
    nll_span: NllSpan = "response"
    invalid_penalty: float = 0.0
    """Added to the reward of a step whose action was not admissible (GiGPO: -0.1)."""
    recycle_after: int | None = 100
    timeout_s: float = 600.0


class Collector:
    """Runs task groups through a policy; owns the env pool and the episode histories."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self.prompts = PromptBuilder(config.history_length, config.template_file)
        self.family = family_of(config.env_id)
        self._pool: EnvPool | None = None

    @property
    def pool(self) -> EnvPool:
        if self._pool is None:
            c = self.config
            self._pool = EnvPool(c.env_id, c.env_kwargs, c.max_live_envs, c.num_workers,
                                 c.recycle_after, c.timeout_s)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def run(self, policy, tasks: Sequence[tuple[int, int | None]], group_size: int = 1,
            on_episode: Callable[[Episode], None] | None = None) -> list[Episode]:
        """Play ``group_size`` episodes of each (task_id, seed); episodes in queue order."""
        queue = [Episode(group=g, traj=g * group_size + i, task_id=int(task), seed=seed)
                 for g, (task, seed) in enumerate(tasks) for i in range(group_size)]
        episodes = list(queue)
        pending = list(reversed(queue))
        live: dict[int, Episode] = {}
        state: dict[int, dict[str, Any]] = {}
        free = list(range(min(self.pool.num_envs, len(queue))))

        def finish(slot: int, ep: Episode) -> None:
            live.pop(slot, None)
            state.pop(slot, None)
            free.append(slot)
            if on_episode is not None:
                on_episode(ep)

        while pending or live:
            starts = []
            while free and pending:
                slot, ep = free.pop(), pending.pop()
                live[slot] = ep
                starts.append((slot, (ep.seed, {"task_id": ep.task_id})))
            for slot, answer in self.pool.call("reset", starts).items():
                ep = live[slot]
                if isinstance(answer, WorkerFailure):
                    ep.failed, ep.error = True, answer.message
                    finish(slot, ep)
                    continue
                obs, info = answer
                ep.task, ep.task_type = info.get("task", ""), info.get("task_type")
                state[slot] = {"obs": obs, "info": info, "history": []}
            if not live:
                continue
            slots = sorted(live)
            experts = (self.pool.call("expert", [(s, None) for s in slots])
                       if getattr(policy, "needs_expert", False) else {})
            turns = [self._turn(s, state[s], experts.get(s)) for s in slots]
            outputs = policy.act(turns)
            if len(outputs) != len(turns):
                raise RuntimeError(f"policy returned {len(outputs)} outputs for {len(turns)} turns")
            results = self.pool.call("step", [(s, o.action) for s, o in zip(slots, outputs)])
            for slot, out in zip(slots, outputs):
                self._record(slot, live[slot], state[slot], out, results[slot], finish)
        return episodes

    def _turn(self, slot: int, st: dict[str, Any], expert) -> Turn:
        info = st["info"]
        expert_action = None if isinstance(expert, WorkerFailure) else expert
        return Turn(self.config.env_id, info.get("task", ""), st["obs"],
                    tuple(info.get("admissible_actions", ())), tuple(st["history"]),
                    len(st["history"]), expert_action, self.family)

    def _record(self, slot: int, ep: Episode, st: dict[str, Any], out: ActionOutput,
                result, finish) -> None:
        if isinstance(result, WorkerFailure):
            ep.failed, ep.error = True, result.message
            finish(slot, ep)
            return
        obs, reward, terminated, truncated, info = result
        valid = bool(info.get("action_valid", True))
        shaped = float(reward) + (0.0 if valid else self.config.invalid_penalty)
        ent = (float(np.mean(out.entropies)) if out.entropies else None)
        ep.steps.append(StepRecord(
            t=len(ep.steps), observation=st["obs"],
            admissible_actions=tuple(st["info"].get("admissible_actions", ())),
            response=out.text, action=out.action, format_valid=out.format_valid,
            action_valid=valid, reward=shaped, env_reward=float(reward),
            state_key=st["info"].get("state_key", ""), next_state_key=info.get("state_key", ""),
            terminated=bool(terminated), truncated=bool(truncated),
            nll=span_nll(out, self.config.nll_span), entropy=ent,
            prompt_ids=out.prompt_ids, completion_ids=out.completion_ids, logprobs=out.logprobs,
            info={k: info[k] for k in ("score", "error") if k in info}))
        st["history"].append((st["obs"], out.action))
        st["obs"], st["info"] = obs, info
        if terminated or truncated:
            ep.won = bool(info.get("won", False))
            ep.score = float(info.get("score", 1.0 if ep.won else 0.0))
            ep.final_observation = obs
            if "error" in info:
                ep.failed, ep.error = True, str(info["error"])
            finish(slot, ep)


def to_step_batch(episodes: Sequence[Episode]):
    """The estimators' :class:`StepBatch` from finished episodes (failed ones left out);
    state keys and action texts become integer codes. Returns (batch, row index) where
    row index lists (episode index, t) per row."""
    from gaca_agent.advantages import StepBatch

    codes: dict[str, int] = {}
    actions: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("group", "traj", "t", "reward", "state",
                                             "next_state", "action", "nll", "terminal",
                                             "entropy")}
    index = []
    for e, ep in enumerate(episodes):
        if ep.failed:
            continue
        for s in ep.steps:
            cols["group"].append(ep.group)
            cols["traj"].append(ep.traj)
            cols["t"].append(s.t)
            cols["reward"].append(s.reward)
            cols["state"].append(codes.setdefault(s.state_key, len(codes)))
            cols["next_state"].append(codes.setdefault(s.next_state_key, len(codes)))
            cols["action"].append(actions.setdefault(s.action.lower(), len(actions)))
            cols["nll"].append(s.nll)
            cols["terminal"].append(s.terminated)
            cols["entropy"].append(s.entropy if s.entropy is not None else s.nll)
            index.append((e, s.t))
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    return StepBatch(**arrays), index
