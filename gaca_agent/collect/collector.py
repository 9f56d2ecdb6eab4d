"""The vectorised multi-turn rollout collector.

``Collector.run(policy, tasks, group_size)`` plays ``group_size`` episodes of every
``(task_id, seed)`` in ``tasks`` (a task group: same task, same seed, same start), with
the environments in worker processes, in this process or on env servers
(:mod:`~gaca_agent.collect.pools`). Each round it asks the policy for
the turns of *all* live environments at once (one batched generation), steps them in
parallel, and refills finished slots from the queue. A policy with ``submit(turn)`` (the
``server`` engine's) is not played in rounds: every live episode has its turn in flight,
and each answered one is stepped and sent its next turn at once. It returns a :class:`Rollout`: the
episodes and one :class:`StepTable` of their step rows (the estimators' fields plus texts,
token ids and log-probs). Episodes whose worker died are kept, marked ``failed`` with
the error; nothing is dropped. With ``env.rerun_lost`` > 0, an episode whose host was
lost (a worker process, a Ray actor or its node, an env server's session) is played
again from its seed on another slot instead, so the rollout is the fault-free one.

Each turn of a seeded episode carries a sampling key, ``row_key(seed, member, step)``
(member = the episode's place in its task group), so a stochastic policy plays an
episode the same way whatever else shares its batch.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
import os
from typing import Any, Callable, Sequence

import numpy as np

from gaca_agent.collect.settings import EnvSection
from gaca_agent.generate.sampling import row_key
from gaca_agent.steps import Episode, Rollout, StepTable, TableBuilder, action_code, code
from gaca_agent.collect.pools import EnvSlots, make_pool
from gaca_agent.collect.workers import WorkerFailure
from gaca_agent.types import ActionOutput, Turn
from gaca_envs.core import observation_key


class Collector:
    """Runs task groups through a policy; owns the env pool and the episode histories.

    ``env`` (:class:`~gaca_agent.collect.settings.EnvSection`, gaca-train's env section)
    is split once into what each part uses: which env and kwargs (``spec``), where its
    episodes run (``hosts``), the prompts (``prompts``), how a step is scored
    (``scoring``). ``token``: the env servers' bearer token (default
    ``$GACA_ENV_TOKEN``). ``pool``: makes the env slots elsewhere (the trainer's Ray
    actors); by default :func:`~gaca_agent.collect.pools.make_pool` of ``spec`` and
    ``hosts``."""

    def __init__(self, env: EnvSection, token: str | None = None,
                 pool: Callable[[], EnvSlots] | None = None) -> None:
        from gaca_agent.generate.families import family_of

        self.spec, self.scoring, self.prompts = env.spec, env.scoring, env.prompts
        self.rerun_lost = env.rerun_lost
        self.token = token if token is not None else os.environ.get("GACA_ENV_TOKEN")
        hosts = env.hosts
        self._make_pool = pool or (lambda: make_pool(self.spec, hosts, self.token))
        self.family = family_of(env.id)
        self._pool: EnvSlots | None = None

    @property
    def pool(self) -> EnvSlots:
        """The env slots, made on first use."""
        if self._pool is None:
            self._pool = self._make_pool()
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def run(self, policy, tasks: Sequence[tuple[int, int | None]], group_size: int = 1,
            on_episode: Callable[[Episode, list[dict[str, Any]]], None] | None = None,
            on_step: Callable[[int], None] | None = None,
            version: int | None = None) -> Rollout:
        """Play ``group_size`` episodes of each (task_id, seed); episodes in queue order.

        ``on_episode(episode, rows)`` is called the moment an episode ends (its step rows
        as dicts, see :meth:`StepTable.record`); ``on_step(n)`` after each round with the
        number of env steps taken in it. ``version``: the weight version every turn is
        pinned to (each step's ``policy_version``, unless the policy reports its own).
        """
        play = _Play([Episode(group=g, traj=g * group_size + i, task_id=int(task), seed=seed)
                      for g, (task, seed) in enumerate(tasks) for i in range(group_size)],
                     self.pool.num_envs, on_episode)
        play.version = version
        self.pool.expert = bool(getattr(policy, "needs_expert", False))
        # a policy that answers turns one by one (the server engine) is not played in
        # rounds: an episode's next turn is sent as soon as its step returns
        streaming = hasattr(policy, "submit") and not getattr(policy, "needs_expert", False)
        inflight: dict[int, Future] = {}
        while play.pending or play.live:
            self._start(play)
            if not play.live:
                continue
            if streaming:
                slots, outputs = self._answered(play, policy, group_size, inflight)
            else:
                slots, outputs = self._round(play, policy, group_size)
            results = self.pool.call("step", [(s, o.action) for s, o in zip(slots, outputs)])
            for slot, out in zip(slots, outputs):
                e = play.live[slot]
                if self._replay(play, slot, e, results[slot]):
                    continue
                self._record(play.queue[e], play.steps[e], play.state[slot], out, results[slot])
                if play.queue[e].failed or play.state[slot].get("done"):
                    play.finish(slot, e)
            if on_step is not None:
                on_step(len(slots))
        return _rollout(play.queue, play.tables)

    def _start(self, play: "_Play") -> None:
        """Reset free slots with the next queued episodes (a failed reset ends one)."""
        self.pool.recycle_idle({self.pool.worker_of(s) for s in play.live})
        starts = []
        for slot in sorted(play.free, reverse=True):
            if not play.pending:
                break
            if self.pool.draining(slot):
                continue  # its worker is waiting for its live episodes to end
            play.free.remove(slot)
            e = play.pending.pop()
            play.live[slot] = e
            ep = play.queue[e]
            starts.append((slot, (ep.seed, {"task_id": ep.task_id})))
        for slot, answer in self.pool.call("reset", starts).items():
            e = play.live[slot]
            if self._replay(play, slot, e, answer):
                continue
            if isinstance(answer, WorkerFailure):
                play.queue[e].failed, play.queue[e].error = True, answer.message
                play.finish(slot, e)
                continue
            obs, info = answer
            ep = play.queue[e]
            ep.task, ep.task_type = info.get("task", ""), info.get("task_type")
            play.state[slot] = {"obs": obs, "info": info, "history": [],
                                "version": play.version}

    def _replay(self, play: "_Play", slot: int, e: int, answer) -> bool:
        """Whether episode ``e`` lost its host and goes back to the queue, to be played
        again from its seed (at most ``env.rerun_lost`` times; then it is kept failed)."""
        if not (isinstance(answer, WorkerFailure) and answer.lost
                and play.replays[e] < self.rerun_lost):
            return False
        play.replays[e] += 1
        play.live.pop(slot)
        play.state.pop(slot, None)
        play.free.append(slot)
        play.steps[e] = TableBuilder()
        play.pending.append(e)  # next to start: the queue's order is kept
        return True

    def _answered(self, play: "_Play", policy, group_size: int, inflight: dict[int, Future]):
        """Every live episode has its turn in flight; the slots answered so far."""
        for s in play.live:
            if s not in inflight:
                inflight[s] = policy.submit(self._turn(play.queue[play.live[s]], group_size,
                                                       play.state[s], None))
        wait(list(inflight.values()), return_when=FIRST_COMPLETED)
        slots = sorted(s for s, f in inflight.items() if f.done())
        return slots, [inflight.pop(s).result() for s in slots]

    def _round(self, play: "_Play", policy, group_size: int):
        """The turns of every live episode in one policy call."""
        slots = sorted(play.live)
        experts = (self.pool.call("expert", [(s, None) for s in slots])
                   if getattr(policy, "needs_expert", False) else {})
        turns = [self._turn(play.queue[play.live[s]], group_size, play.state[s], experts.get(s))
                 for s in slots]
        outputs = policy.act(turns)
        if len(outputs) != len(turns):
            raise RuntimeError(f"policy returned {len(outputs)} outputs for {len(turns)} turns")
        return slots, outputs

    def _turn(self, ep: Episode, group_size: int, st: dict[str, Any], expert) -> Turn:
        info = st["info"]
        expert_action = None if isinstance(expert, WorkerFailure) else expert
        step = len(st["history"])
        key = (None if ep.seed is None else
               row_key(ep.seed, ep.traj % group_size, step))
        return Turn(self.spec.id, info.get("task", ""), st["obs"],
                    tuple(info.get("admissible_actions", ())), tuple(st["history"]),
                    step, expert_action, self.family, key, st.get("version"),
                    (ep.seed, ep.traj))

    def _record(self, ep: Episode, steps: TableBuilder, st: dict[str, Any],
                out: ActionOutput, result) -> None:
        if isinstance(result, WorkerFailure):
            ep.failed, ep.error = True, result.message
            return
        obs, reward, terminated, truncated, info = result
        valid = bool(info.get("action_valid", True))
        shaped, penalty = self.scoring.score(reward, bool(terminated and info.get("won")),
                                             valid, out.text)
        nll = out.nll or {}
        before = st["info"]
        # an env without state keys (a plain gymnasium env): its observations stand in
        state_key = before.get("state_key") or observation_key(st["obs"])
        next_key = info.get("state_key") or observation_key(obs)
        steps.append(
            group=ep.group, traj=ep.traj, t=len(steps), observation=st["obs"],
            admissible_actions=tuple(before.get("admissible_actions", ())),
            response=out.text, action_text=out.action, action=action_code(out.action),
            format_valid=out.format_valid, action_valid=valid, reward=shaped,
            penalty=penalty,
            env_reward=float(reward), state_key=state_key, state=code(state_key),
            next_state_key=next_key, next_state=code(next_key),
            obs_state=code(st["obs"]), obs_next_state=code(obs),
            terminal=bool(terminated), truncated=bool(truncated),
            nll=float(nll.get(self.scoring.nll_span, 0.0)),
            nll_response=float(nll.get("response", 0.0)),
            nll_action=float(nll.get("action", 0.0)),
            nll_think=float(nll.get("think", 0.0)),
            entropy=float(np.mean(out.entropies)) if out.entropies else float("nan"),
            policy_version=_version_of(out, st.get("version")),
            prompt_ids=out.prompt_ids, completion_ids=out.completion_ids,
            logprobs=out.logprobs,
            info={**{k: info[k] for k in ("score", "error") if k in info},
                  **({"token_source": out.extra["token_source"]}
                     if out.extra.get("token_source") == "retokenized" else {})})
        st["history"].append((st["obs"], out.action))
        st["obs"], st["info"] = obs, info
        if terminated or truncated:
            ep.won = bool(info.get("won", False))
            ep.score = float(info.get("score", 1.0 if ep.won else 0.0))
            ep.final_observation = obs
            if "error" in info:
                ep.failed, ep.error = True, str(info["error"])
            st["done"] = True


def _version_of(out: ActionOutput, pinned: int | None) -> int:
    """The weight version that sampled a step: the policy's word, else the pinned one,
    else -1 (unknown)."""
    reported = out.extra.get("policy_version")
    if reported is not None:
        return int(reported)
    return -1 if pinned is None else int(pinned)


class _Play:
    """The episodes of one :meth:`Collector.run`: queued, live (slot -> episode), each
    live slot's observation and history, and every episode's steps."""

    def __init__(self, queue: list[Episode], num_envs: int,
                 on_episode: Callable[[Episode, list[dict[str, Any]]], None] | None) -> None:
        self.queue, self.on_episode = queue, on_episode
        self.steps = [TableBuilder() for _ in queue]
        self.tables: list[StepTable | None] = [None] * len(queue)
        self.pending = list(reversed(range(len(queue))))
        self.live: dict[int, int] = {}
        self.state: dict[int, dict[str, Any]] = {}
        self.free = list(range(min(num_envs, len(queue))))
        self.version: int | None = None  # the weight version every turn is pinned to
        self.replays = [0] * len(queue)  # times each episode was played again (lost host)

    def finish(self, slot: int, e: int) -> None:
        """Episode ``e`` has ended: its table is made and its slot freed."""
        self.live.pop(slot, None)
        self.state.pop(slot, None)
        self.free.append(slot)
        ep = self.queue[e]
        table = self.tables[e] = self.steps[e].table(episode=e, failed=ep.failed)
        ep.length = len(table)
        ep.total_reward = float(sum(table["reward"].tolist()))  # in step order, as Python sums
        if self.on_episode is not None:
            self.on_episode(ep, [table.record(i) for i in range(len(table))])


def _rollout(episodes: list[Episode], tables: list[StepTable | None]) -> Rollout:
    """One table of every episode's rows, in queue order (each episode's table was made
    when it ended)."""
    start = 0
    for ep, table in zip(episodes, tables):
        ep.rows = range(start, start + len(table))
        start += len(table)
    return Rollout(episodes, StepTable.concat(tables) if tables else TableBuilder().table())
