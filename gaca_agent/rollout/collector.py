"""The vectorised multi-turn rollout collector.

``Collector.run(policy, tasks, group_size)`` plays ``group_size`` episodes of every
``(task_id, seed)`` in ``tasks`` (a task group: same task, same seed, same start), with
the environments in worker processes (:mod:`workers`). Each round it asks the policy for
the turns of *all* live environments at once (one batched generation), steps them in
parallel, and refills finished slots from the queue. A policy with ``submit(turn)`` (the
``server`` engine's) is not played in rounds: every live episode has its turn in flight,
and each answered one is stepped and sent its next turn at once. It returns a :class:`Rollout`: the
episodes and one :class:`StepTable` of their step rows (ALGORITHMS.md's fields plus texts,
token ids and log-probs). Episodes whose worker died are kept, marked ``failed`` with
the error; nothing is dropped.

Each turn of a seeded episode carries a sampling key, ``row_key(seed, member, step)``
(member = the episode's place in its task group), so a stochastic policy plays an
episode the same way whatever else shares its batch.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np

from gaca_agent.rollout.prompts import PromptBuilder, verl_format_valid
from gaca_agent.rollout.sampling import row_key
from gaca_agent.rollout.spans import NllSpan
from gaca_agent.rollout.table import Episode, Rollout, StepTable, code
from gaca_agent.rollout.workers import EnvPool, WorkerFailure
from gaca_agent.types import ActionOutput, Turn


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
    """The penalty of an invalid step (GiGPO: -0.1); see ``invalid_definition`` and
    ``penalty_mode``."""
    invalid_definition: Literal["admissible", "format"] = "admissible"
    """``admissible``: a step is invalid when its action was not admissible (ours: a
    malformed response has no admissible action either); ``format``: when the response
    lacks verl-agent's <think>/<action> tags or holds a CJK character (verl-agent's)."""
    penalty_mode: Literal["reward", "row"] = "reward"
    """``reward``: the penalty is added to the step's reward, so it enters R_i and every
    G_t before it (ours); ``row``: it is kept out of the rewards and applied to that row's
    scores after discounting (the ``penalty`` column; verl-agent's)."""
    reward: Literal["env", "success"] = "env"
    """``env``: the environment's reward (WebShop: its score at the purchase); ``success``:
    1 on the step that wins, else 0 (verl-agent's WebShop: only a score of 1 pays)."""
    reward_scale: float = 1.0
    """Multiplies the (env or success) reward (verl-agent pays 10 for success)."""
    recycle_after: int | None = 100
    """Resets after which a worker process is replaced (once none of its envs is
    mid-episode): ALFWorld processes grow with every new game."""
    timeout_s: float = 600.0
    env_servers: list[str] | None = None
    """URLs of ``gaca-env-serve`` servers of ``env_id``: the env slots are sessions there
    (spread round-robin) instead of local worker processes (``num_workers`` and
    ``recycle_after`` then do not apply); see :mod:`gaca_agent.rollout.remote_pool`."""
    env_token: str | None = None
    """Bearer token of the env servers (``gaca-env-serve --token``)."""


class Collector:
    """Runs task groups through a policy; owns the env pool and the episode histories."""

    def __init__(self, config: CollectorConfig) -> None:
        from gaca_envs.registration import family_of

        self.config = config
        self.prompts = PromptBuilder(config.history_length, config.template_file)
        self.family = family_of(config.env_id)
        self._pool: EnvPool | None = None

    @property
    def pool(self) -> EnvPool:
        if self._pool is None:
            c = self.config
            if c.env_servers:
                from gaca_agent.rollout.remote_pool import RemotePool

                self._pool = RemotePool(c.env_servers, c.env_id, c.env_kwargs,
                                        c.max_live_envs, c.timeout_s, c.env_token)
            else:
                self._pool = EnvPool(c.env_id, c.env_kwargs, c.max_live_envs, c.num_workers,
                                     c.recycle_after, c.timeout_s)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def run(self, policy, tasks: Sequence[tuple[int, int | None]], group_size: int = 1,
            on_episode: Callable[[Episode, list[dict[str, Any]]], None] | None = None,
            on_step: Callable[[int], None] | None = None) -> Rollout:
        """Play ``group_size`` episodes of each (task_id, seed); episodes in queue order.

        ``on_episode(episode, rows)`` is called the moment an episode ends (its step rows
        as dicts, see :meth:`StepTable.record`); ``on_step(n)`` after each round with the
        number of env steps taken in it.
        """
        queue = [Episode(group=g, traj=g * group_size + i, task_id=int(task), seed=seed)
                 for g, (task, seed) in enumerate(tasks) for i in range(group_size)]
        rows: list[list[dict[str, Any]]] = [[] for _ in queue]
        pending = list(reversed(range(len(queue))))
        live: dict[int, int] = {}  # slot -> episode index
        state: dict[int, dict[str, Any]] = {}
        free = list(range(min(self.pool.num_envs, len(queue))))
        if hasattr(self.pool, "expert"):  # env servers send expert actions only when asked
            self.pool.expert = bool(getattr(policy, "needs_expert", False))
        # a policy that answers turns one by one (the server engine) is not played in
        # rounds: an episode's next turn is sent as soon as its step returns
        streaming = hasattr(policy, "submit") and not getattr(policy, "needs_expert", False)
        inflight: dict[int, Future] = {}

        def finish(slot: int, e: int) -> None:
            live.pop(slot, None)
            state.pop(slot, None)
            free.append(slot)
            ep = queue[e]
            ep.length = len(rows[e])
            ep.total_reward = float(sum(r["reward"] for r in rows[e]))
            if on_episode is not None:
                for r in rows[e]:
                    r["failed"] = ep.failed
                table = StepTable.from_rows([_with_codes(r) for r in rows[e]])
                on_episode(ep, [table.record(i) for i in range(len(table))])

        while pending or live:
            self.pool.recycle_idle({self.pool.worker_of(s) for s in live})
            starts = []
            for slot in sorted(free, reverse=True):
                if not pending:
                    break
                if self.pool.draining(slot):
                    continue  # its worker is waiting for its live episodes to end
                free.remove(slot)
                e = pending.pop()
                live[slot] = e
                starts.append((slot, (queue[e].seed, {"task_id": queue[e].task_id})))
            for slot, answer in self.pool.call("reset", starts).items():
                e = live[slot]
                if isinstance(answer, WorkerFailure):
                    queue[e].failed, queue[e].error = True, answer.message
                    finish(slot, e)
                    continue
                obs, info = answer
                queue[e].task, queue[e].task_type = info.get("task", ""), info.get("task_type")
                state[slot] = {"obs": obs, "info": info, "history": []}
            if not live:
                continue
            if streaming:  # each live episode has its turn in flight; take those answered
                for s in live:
                    if s not in inflight:
                        inflight[s] = policy.submit(self._turn(queue[live[s]], group_size,
                                                               state[s], None))
                wait(list(inflight.values()), return_when=FIRST_COMPLETED)
                slots = sorted(s for s, f in inflight.items() if f.done())
                outputs = [inflight.pop(s).result() for s in slots]
            else:
                slots = sorted(live)
                experts = (self.pool.call("expert", [(s, None) for s in slots])
                           if getattr(policy, "needs_expert", False) else {})
                turns = [self._turn(queue[live[s]], group_size, state[s], experts.get(s))
                         for s in slots]
                outputs = policy.act(turns)
                if len(outputs) != len(turns):
                    raise RuntimeError(f"policy returned {len(outputs)} outputs for "
                                       f"{len(turns)} turns")
            results = self.pool.call("step", [(s, o.action) for s, o in zip(slots, outputs)])
            for slot, out in zip(slots, outputs):
                e = live[slot]
                self._record(queue[e], rows[e], state[slot], out, results[slot])
                if queue[e].failed or state[slot].get("done"):
                    finish(slot, e)
            if on_step is not None:
                on_step(len(slots))
        return _rollout(queue, rows)

    def _turn(self, ep: Episode, group_size: int, st: dict[str, Any], expert) -> Turn:
        info = st["info"]
        expert_action = None if isinstance(expert, WorkerFailure) else expert
        step = len(st["history"])
        key = (None if ep.seed is None else
               row_key(ep.seed, ep.traj % group_size, step))
        return Turn(self.config.env_id, info.get("task", ""), st["obs"],
                    tuple(info.get("admissible_actions", ())), tuple(st["history"]),
                    step, expert_action, self.family, key)

    def _record(self, ep: Episode, rows: list[dict[str, Any]], st: dict[str, Any],
                out: ActionOutput, result) -> None:
        if isinstance(result, WorkerFailure):
            ep.failed, ep.error = True, result.message
            return
        obs, reward, terminated, truncated, info = result
        c = self.config
        valid = bool(info.get("action_valid", True))
        base = (float(bool(terminated and info.get("won"))) if c.reward == "success"
                else float(reward)) * c.reward_scale
        invalid = not verl_format_valid(out.text) if c.invalid_definition == "format" \
            else not valid
        penalty = c.invalid_penalty if invalid else 0.0
        shaped = base + (penalty if c.penalty_mode == "reward" else 0.0)
        nll = out.nll or {}
        before = st["info"]
        rows.append({
            "group": ep.group, "traj": ep.traj, "t": len(rows), "observation": st["obs"],
            "admissible_actions": tuple(before.get("admissible_actions", ())),
            "response": out.text, "action_text": out.action,
            "format_valid": out.format_valid, "action_valid": valid, "reward": shaped,
            "penalty": penalty if c.penalty_mode == "row" else 0.0,
            "env_reward": float(reward), "state_key": before.get("state_key", ""),
            "next_observation": obs,
            "next_state_key": info.get("state_key", ""), "terminated": bool(terminated),
            "truncated": bool(truncated), "nll": float(nll.get(self.config.nll_span, 0.0)),
            "nll_response": float(nll.get("response", 0.0)),
            "nll_action": float(nll.get("action", 0.0)),
            "nll_think": float(nll.get("think", 0.0)),
            "entropy": float(np.mean(out.entropies)) if out.entropies else float("nan"),
            "prompt_ids": out.prompt_ids, "completion_ids": out.completion_ids,
            "logprobs": out.logprobs,
            "info": {**{k: info[k] for k in ("score", "error") if k in info},
                     **({"token_source": out.extra["token_source"]}
                        if out.extra.get("token_source") == "retokenized" else {})}})
        st["history"].append((st["obs"], out.action))
        st["obs"], st["info"] = obs, info
        if terminated or truncated:
            ep.won = bool(info.get("won", False))
            ep.score = float(info.get("score", 1.0 if ep.won else 0.0))
            ep.final_observation = obs
            if "error" in info:
                ep.failed, ep.error = True, str(info["error"])
            st["done"] = True


def _with_codes(row: dict[str, Any]) -> dict[str, Any]:
    return {"episode": row.get("episode", 0), "failed": row.get("failed", False),
            "state": code(row["state_key"]), "next_state": code(row["next_state_key"]),
            "obs_state": code(row["observation"]),
            "obs_next_state": code(row["next_observation"]),
            "action": code(row["action_text"].lower()), **row}


def _rollout(episodes: list[Episode], rows: list[list[dict[str, Any]]]) -> Rollout:
    flat: list[dict[str, Any]] = []
    for e, (ep, ep_rows) in enumerate(zip(episodes, rows)):
        start = len(flat)
        for r in ep_rows:
            r["episode"], r["failed"] = e, ep.failed
            flat.append(_with_codes(r))
        ep.rows = range(start, len(flat))
        ep.length = len(ep_rows)
        ep.total_reward = float(sum(r["reward"] for r in ep_rows))
    return Rollout(episodes, StepTable.from_rows(flat))
