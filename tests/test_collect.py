"""The collector's parts a user relies on without seeing them: each env answers for
itself in its worker, slots live in their own workers, a stalled or recycled worker is
replaced (only a failure counts as a restart), and every step row says what happened:
the reward with its penalty, the state it led to, the NLL span, the episode's total."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from conftest import has_module
from gaca_agent.collect.collector import Collector
from gaca_agent.collect.pools import LocalPool, make_pool
from gaca_agent.collect.settings import EnvSpec, HostSettings
from gaca_agent.collect.workers import EnvHost, EnvPool, WorkerFailure, serve_pipe
from gaca_agent.config import EnvSection
from gaca_agent.generate.prompts import format_response
from gaca_agent.generate.sampling import row_key
from gaca_agent.policies import make_policy
from gaca_agent.types import ActionOutput

CORRIDOR = "gaca/Diag-Corridor-v0"
STALL = "collect_probe:gaca-test/Stall-v0"


def test_env_host_answers_each_env_for_itself():
    import gymnasium as gym

    host = EnvHost(CORRIDOR, {"split": "test"})
    try:
        first = host.handle("reset", [(0, (1, {"task_id": 0})), (3, (2, {"task_id": 5})),
                                      (1, (1, {"task_id": 99}))])
        assert [i for i, _ in first] == [0, 3, 1]
        (_, (obs0, info0)), (_, (obs3, info3)), (_, bad) = first
        assert info0["task_id"] == 0 and info3["task_id"] == 5
        assert isinstance(bad, WorkerFailure) and "99" in bad.message  # that env alone
        fresh = gym.make(CORRIDOR, split="test")
        obs, info = fresh.reset(seed=2, options={"task_id": 5})
        assert (obs3, info3["state_key"]) == (obs, info["state_key"])
        expert = dict(host.handle("expert", [(3, None)]))[3]
        assert expert == fresh.unwrapped.expert_action()
        stepped = dict(host.handle("step", [(3, expert), (0, "dance")]))
        assert stepped[3][:4] == fresh.step(expert)[:4]
        assert stepped[0][4]["action_valid"] is False  # an inadmissible action: a no-op
        assert dict(host.handle("pid", [(0, None)]))[0] == os.getpid()
        unknown = dict(host.handle("dance", [(0, None), (3, None)]))
        assert all(isinstance(a, WorkerFailure) and
                   a.message.startswith("ValueError: unknown env command 'dance'")
                   for a in unknown.values())
        drawn = dict(host.handle("reset", [(7, (11, None))]))[7]  # the seed draws the task
        assert drawn[1]["task_id"] == fresh.reset(seed=11)[1]["task_id"]
        assert sorted(host.envs) == [0, 3, 7]  # env 1's reset failed: it is made anew
    finally:
        host.close()
    assert host.envs == {}
    plain = EnvHost(STALL)
    try:  # an env without expert_action answers None, not an error
        assert dict(plain.handle("expert", [(0, None)])) == {0: None}
    finally:
        plain.close()


def test_the_pipe_loop_serves_until_close_and_closes_its_envs():
    parent, child = mp.Pipe()
    host = EnvHost(CORRIDOR, {"split": "test"})
    loop = threading.Thread(target=serve_pipe, args=(child, host))
    loop.start()
    parent.send(("reset", [(0, (1, {"task_id": 2}))]))
    [(i, (obs, info))] = parent.recv()
    assert i == 0 and info["task_id"] == 2 and host.envs
    parent.send(("close", []))
    loop.join(timeout=10)
    assert not loop.is_alive() and host.envs == {}
    parent2, child2 = mp.Pipe()
    host2 = EnvHost(CORRIDOR, {"split": "test"})
    loop2 = threading.Thread(target=serve_pipe, args=(child2, host2))
    loop2.start()
    parent2.close()  # the parent gone: the loop ends too
    loop2.join(timeout=10)
    assert not loop2.is_alive()


def test_workers_start_fresh_with_the_pools_env_kwargs():
    import collect_probe
    import gymnasium as gym

    collect_probe.MARK = 1  # this process only: spawned workers import the module anew
    try:
        with EnvPool(STALL, num_envs=1, num_workers=1) as pool:
            assert pool.call("reset", [(0, (0, None))])[0][1]["mark"] == 0
    finally:
        collect_probe.MARK = 0
    with EnvPool(CORRIDOR, {"split": "test"}, num_envs=1) as pool:  # not the default split
        task = pool.call("reset", [(0, (0, {"task_id": 3}))])[0][1]["task"]
    assert task == gym.make(CORRIDOR, split="test").reset(options={"task_id": 3})[1]["task"]
    for bad in ({"num_envs": 0}, {"num_workers": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            EnvPool(CORRIDOR, **bad)


def test_slots_live_in_their_own_workers():
    with EnvPool(CORRIDOR, {"split": "test"}, num_envs=4, num_workers=2) as pool:
        pids = pool.pids()
        assert len(set(pids)) == 2
        answers = pool.call("pid", [(s, None) for s in range(4)])
        assert [answers[s] for s in range(4)] == [pids[s % 2] for s in range(4)]
        resets = pool.call("reset", [(s, (s, {"task_id": s})) for s in range(4)])
        assert [resets[s][1]["task_id"] for s in range(4)] == [0, 1, 2, 3]  # own envs
        assert len({resets[s][1]["task"] for s in range(4)}) > 1


def test_recycling_waits_and_is_not_counted_as_a_restart():
    with EnvPool(CORRIDOR, {"split": "test"}, num_envs=2, num_workers=2,
                 recycle_after=2) as pool:
        before = pool.pids()
        pool.call("reset", [(0, (0, {"task_id": 0}))])
        assert not pool.draining(0)
        pool.call("reset", [(0, (0, {"task_id": 1})), (1, (0, {"task_id": 1}))])
        assert pool.draining(0) and not pool.draining(1)  # worker 0: 2 resets, worker 1: 1
        assert pool.recycle_idle({0}) == 0 and pool.pids() == before  # mid-episode
        assert pool.recycle_idle(set()) == 1
        after = pool.pids()
        assert after[0] != before[0] and after[1] == before[1]
        assert (pool.restarts, pool.recycles) == (0, 1)
        assert not pool.draining(0)
        answer = pool.call("reset", [(0, (3, {"task_id": 3}))])[0]
        assert answer[1]["task_id"] == 3  # the new worker serves
        pool.call("reset", [(0, (0, None)), (1, (0, None))])
        assert pool.draining(0) and pool.draining(1)
        assert pool.recycle_idle(set()) == 2 and pool.recycles == 3  # both, counted


def test_a_new_workers_start_up_is_not_a_stall():
    """A worker process whose env takes longer to build than a step may take (a loaded
    machine, ALFWorld's games) answers its first reset; once it has answered, a step
    that stalls past ``timeout_s`` fails it as before."""
    with EnvPool(STALL, {"build_s": 3.0}, num_envs=1, num_workers=1, timeout_s=1) as pool:
        assert pool.call("reset", [(0, (0, None))])[0][0] == "ready"
        assert pool.restarts == 0
        t0 = time.monotonic()
        assert isinstance(pool.call("step", [(0, "stall")])[0], WorkerFailure)
        assert time.monotonic() - t0 < 30 and pool.restarts == 1


def test_stuck_workers_share_one_deadline_per_call():
    """Two workers stuck in one call: the second is waited for only what is left of the
    call's deadline (k stuck hosts cost timeout_s, not k times it)."""
    with EnvPool(STALL, num_envs=2, num_workers=2, timeout_s=3) as pool:
        pool.call("reset", [(0, (0, None)), (1, (0, None))])
        waits = []
        receive = pool._receive
        pool._receive = lambda w, t: (waits.append(t), receive(w, t))[1]
        both = pool.call("step", [(0, "stall"), (1, "stall")])
        assert all(isinstance(f, WorkerFailure) for f in both.values())
        assert waits[0] == pytest.approx(3, abs=0.5) and waits[1] < 1.0


def test_a_stalled_worker_is_restarted_and_only_its_slots_fail():
    with EnvPool(STALL, num_envs=2, num_workers=2, timeout_s=2) as pool:
        before = pool.pids()
        pool.call("reset", [(0, (0, None)), (1, (0, None))])
        out = pool.call("step", [(0, "stall"), (1, "finish")])
        assert isinstance(out[0], WorkerFailure) and "stopped answering" in out[0].message
        assert out[1][1] == 1.0 and out[1][2] is True
        assert pool.restarts == 1 and pool.recycles == 0
        assert pool.pids()[0] != before[0] and pool.pids()[1] == before[1]
        with pytest.raises(ProcessLookupError):
            os.kill(before[0], 0)  # the stalled process was killed and reaped
        raised = pool.call("step", [(1, "explode")])[1]
        assert isinstance(raised, WorkerFailure) and "exploded" in raised.message
        assert raised.message.startswith("RuntimeError: the probe env exploded")
        assert pool.restarts == 1  # an env's error is not a dead worker
        assert pool.call("reset", [(0, (0, None))])[0][0] == "ready"
        assert pool.call("expert", [(0, None)])[0] is None  # no expert: None, not an error
        pool.call("reset", [(1, (0, None))])
        both = pool.call("step", [(0, "stall"), (1, "stall")])
        assert set(both) == {0, 1} and all(isinstance(f, WorkerFailure) for f in both.values())
        assert pool.restarts == 3  # each failure counted, on its own slot


class Scripted:
    """Plays ``first`` at step 0, then the expert; fills NLL spans and entropies."""

    needs_expert = True

    def __init__(self, first: str, text: str | None = None):
        self.first, self.text, self.turns = first, text, []

    def act(self, turns):
        self.turns.extend(turns)
        out = []
        for turn in turns:
            action = self.first if turn.step == 0 else turn.expert_action
            text = self.text if (turn.step == 0 and self.text) else format_response(action)
            out.append(ActionOutput(text, action, nll={"response": 1.0 + turn.step,
                                                       "action": 2.0, "think": 3.0},
                                    entropies=[0.5, 1.5] if turn.step else None,
                                    extra={"token_source": "retokenized"}))
        return out


def play(policy, tasks, group_size=1, env_id=CORRIDOR, **env):
    """The episodes of ``tasks``, envs in this process (``workers: 0``) unless asked."""
    section = EnvSection(id=env_id, kwargs={} if env_id == STALL else {"split": "test"},
                         **{"max_live_envs": 4, "invalid_penalty": -0.1, "workers": 0, **env})
    collector = Collector(section)
    try:
        return collector.run(policy, tasks, group_size)
    finally:
        collector.close()


@pytest.mark.parametrize("mode", ["reward", "row"])
def test_the_invalid_penalty_falls_on_invalid_steps_only(mode):
    rollout = play(Scripted("dance"), [(0, 1), (1, 2)], penalty_mode=mode, reward_scale=10)
    t = rollout.table
    for ep in rollout.episodes:
        rows = list(ep.rows)
        assert ep.won and ep.score == 1.0 and ep.length == len(rows) > 2
        assert t["action_valid"][rows].tolist() == [False] + [True] * (len(rows) - 1)
        penalty, reward = t["penalty"][rows], t["reward"][rows]
        if mode == "reward":  # in the step's reward
            assert reward.tolist() == [-0.1] + [0.0] * (len(rows) - 2) + [10.0]
            assert penalty.tolist() == [0.0] * len(rows)
        else:  # on the row, apart from the reward
            assert reward.tolist() == [0.0] * (len(rows) - 1) + [10.0]
            assert penalty.tolist() == [-0.1] + [0.0] * (len(rows) - 1)
        assert t["env_reward"][rows].tolist() == [0.0] * (len(rows) - 1) + [1.0]
        assert ep.total_reward == pytest.approx(float(reward.sum()))  # every step counted
        assert ep.total_reward == pytest.approx(9.9 if mode == "reward" else 10.0)


def test_each_env_key_reaches_the_one_section_that_uses_it():
    """The env section's flat YAML keys are split into the collector's sections (spec,
    hosts, prompts, scoring); a key in none of them (bar the run's own) would be lost."""
    from dataclasses import fields

    values = {"id": CORRIDOR, "kwargs": {"split": "test"}, "workers": 3, "max_live_envs": 5,
              "servers": ("http://h:1",), "recycle_after": 7, "timeout_s": 9.0,
              "history_length": 4, "template_file": "t.py", "invalid_penalty": -0.3,
              "invalid_definition": "format", "penalty_mode": "row", "reward": "success",
              "reward_scale": 2.0, "nll_span": "action"}
    env = EnvSection(**values)
    parts = (env.spec, env.hosts, env.prompts, env.scoring)
    seen = {f.name: getattr(part, f.name) for part in parts for f in fields(part)}
    assert seen == values
    run_keys = {"eval_kwargs", "eval_episodes", "groups", "group_size", "rerun_lost"}
    assert {f.name for f in fields(EnvSection)} == set(values) | run_keys


def test_format_invalid_steps_and_success_reward():
    """verl-agent's definitions: a response without think tags is invalid even when its
    action is admissible; ``success`` pays 1 on the winning step only."""
    rollout = play(Scripted("walk forward", text="<action>walk forward</action>"), [(0, 1)],
                   invalid_definition="format", reward="success")
    t, [ep] = rollout.table, rollout.episodes
    assert t["action_valid"][0] and t["reward"][0] == pytest.approx(-0.1)
    assert ep.total_reward == pytest.approx(0.9) and t["reward"][-1] == 1.0
    assert t["reward"][1:-1].tolist() == [0.0] * (len(t) - 2)


def test_every_step_leads_to_the_next_steps_state():
    rollout = play(make_policy("random", seed=4), [(0, 1), (1, 2), (2, 3)], group_size=3)
    t = rollout.table
    assert len(rollout.episodes) == 9
    for ep in rollout.episodes:
        rows = list(ep.rows)
        for a, b in zip(rows, rows[1:]):
            assert t["next_state_key"][a] == t["state_key"][b]
            assert t["next_state"][a] == t["state"][b]
            assert t["obs_next_state"][a] == t["obs_state"][b]
        last = rows[-1]
        assert t["terminal"][last] or t["truncated"][last]
        if t["terminal"][last]:  # the terminal state has a key of its own
            assert t["next_state_key"][last] != t["state_key"][last]
        assert ep.final_observation


def test_rows_carry_the_turn_keys_spans_and_token_source():
    policy = Scripted("walk forward")
    rollout = play(policy, [(0, 7), (1, 8)], group_size=2, nll_span="action")
    t = rollout.table
    assert t["nll"].tolist() == [2.0] * len(t)  # the configured span
    assert t["nll_response"][list(rollout.episodes[0].rows)][:2].tolist() == [1.0, 2.0]
    assert t["nll_think"].tolist() == [3.0] * len(t)
    first = [ep.rows[0] for ep in rollout.episodes]
    assert all(math.isnan(t["entropy"][r]) for r in first)
    assert all(t["entropy"][r + 1] == 1.0 for r in first)  # the mean of the entropies
    assert all(info.get("token_source") == "retokenized" for info in t["info"])
    keys = {(turn.key, turn.step) for turn in policy.turns}
    for g, seed in enumerate((7, 8)):
        for member in range(2):
            assert (row_key(seed, member, 0), 0) in keys and (row_key(seed, member, 1), 1) in keys
    turn = next(tn for tn in policy.turns if tn.step == 2)
    assert len(turn.history) == 2 and turn.expert_action is not None
    assert [(e.group, e.traj) for e in rollout.episodes] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert np.all(np.diff([e.rows.start for e in rollout.episodes]) > 0)


def test_a_worker_ignores_ctrl_c_and_serves_its_pipe():
    import signal

    from gaca_agent.collect.workers import _worker_main

    parent, child = mp.Pipe()
    parent.send(("reset", [(0, (1, {"task_id": 4}))]))
    parent.send(("close", []))
    before = signal.getsignal(signal.SIGINT)
    try:
        _worker_main(child, CORRIDOR, {"split": "test"})  # returns at "close"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    [(i, (obs, info))] = parent.recv()
    assert i == 0 and info["task_id"] == 4 and obs


class Streaming:
    """A policy that answers turn by turn (the server engine's shape; it says nothing
    about experts): each answer comes back after a delay that depends on the episode,
    so episodes finish out of order."""

    def __init__(self):
        self.submitted = []

    def submit(self, turn):
        from concurrent.futures import Future

        self.submitted.append(turn)
        future = Future()
        delay = 0.002 * (turn.key % 7)
        action = "walk forward" if "passage" in turn.observation else \
            turn.admissible_actions[0]
        threading.Timer(delay, future.set_result,
                        [ActionOutput(format_response(action), action)]).start()
        return future


def test_a_streaming_policy_plays_every_episode_with_its_own_keys():
    policy = Streaming()
    rollout = play(policy, [(k, 30 + k) for k in range(5)], group_size=2)
    assert len(rollout.episodes) == 10 and not any(e.failed for e in rollout.episodes)
    t = rollout.table
    for ep in rollout.episodes:
        rows = list(ep.rows)
        assert t["t"][rows].tolist() == list(range(ep.length))
        assert t["terminal"][rows[-1]] or t["truncated"][rows[-1]]
    assert len(policy.submitted) == len(t)  # one turn per step, none sent twice
    keys = {(tn.key, tn.step) for tn in policy.submitted}
    assert len(keys) == len(t)
    assert (row_key(30, 1, 0), 0) in keys and (row_key(34, 0, 0), 0) in keys


def test_the_env_section_chooses_the_backend_and_every_backend_plays_alike():
    with pytest.raises(ValueError, match="env.workers must be >= 0"):
        EnvSection(id=CORRIDOR, workers=-1)
    corridor = EnvSpec(CORRIDOR, {"split": "test"})
    local = make_pool(corridor, HostSettings(workers=0, max_live_envs=3))
    procs = make_pool(corridor, HostSettings(workers=2, max_live_envs=3, recycle_after=5,
                                             timeout_s=9))
    try:
        assert isinstance(local, LocalPool) and isinstance(procs, EnvPool)
        assert (local.num_envs, local.num_workers, local.pids()) == (3, 1, [os.getpid()])
        assert (procs.num_envs, procs.num_workers, procs.recycle_after, procs.timeout_s) == \
            (3, 2, 5, 9)
        assert not local.draining(2) and local.recycle_idle(set()) == 0
        assert [local.worker_of(s) for s in range(3)] == [0, 0, 0]
        assert (local.restarts, local.recycles, local.expert) == (0, 0, False)
        starts = [(s, (s, {"task_id": s + 4})) for s in range(3)]
        assert local.call("reset", starts) == procs.call("reset", starts)
        moves = [(s, "walk forward") for s in range(3)]
        assert local.call("step", moves) == procs.call("step", moves)
    finally:
        local.close()
        procs.close()
    assert local.host.envs == {}
    with pytest.raises(ValueError, match="num_envs"):
        LocalPool(CORRIDOR, num_envs=0)
    with pytest.raises(RuntimeError, match="cannot be reached"):  # servers: a RemotePool
        make_pool(corridor, HostSettings(servers=("http://127.0.0.1:9",)))


def test_rollouts_are_the_same_in_this_process_and_in_workers():
    tasks = [(k, 50 + k) for k in range(4)]
    a = play(make_policy("random", seed=2), tasks, group_size=2)
    b = play(make_policy("random", seed=2), tasks, group_size=2, workers=2)
    for col in ("state_key", "action_text", "reward", "terminal", "next_state_key"):
        assert list(a.table[col]) == list(b.table[col]), col
    assert [e.length for e in a.episodes] == [e.length for e in b.episodes]


class FlakyHosts:
    """HostPool over EnvHosts in this process; a worker in ``dead`` does not answer its
    next call (as a worker process or Ray actor that died)."""

    @staticmethod
    def make(num_envs=4, num_workers=2):
        from gaca_agent.collect.workers import HostPool

        class Pool(HostPool):
            def __init__(self):
                super().__init__(num_envs, num_workers, None, 1.0)
                self.hosts, self.pending, self.dead = {}, {}, set()
                for w in range(self.num_workers):
                    self._start(w)

            def _start(self, w):
                self.hosts[w] = EnvHost(CORRIDOR, {"split": "test"})

            def _stop(self, w):
                self.hosts[w].close()

            def _send(self, w, cmd, items):
                self.pending[w] = (cmd, items)
                return True

            def _receive(self, w, timeout_s):
                cmd, items = self.pending.pop(w)
                if w in self.dead:
                    self.dead.discard(w)
                    return None
                return self.hosts[w].handle(cmd, items)

        return Pool()


def test_a_worker_lost_in_another_slots_call_loses_every_episode_it_held():
    """Worker 1 dies while only slot 1 is being reset; slot 3, mid-episode there, lost its
    env too: it answers a lost-host failure (not the new env's "reset first") until reset."""
    pool = FlakyHosts.make()
    assert not any(isinstance(a, WorkerFailure)
                   for a in pool.call("reset", [(1, (0, {"task_id": 0})),
                                                (3, (0, {"task_id": 1}))]).values())
    pool.dead.add(1)
    failed = pool.call("reset", [(1, (5, {"task_id": 2}))])[1]
    assert failed.lost and pool.restarts == 1
    lost = pool.call("step", [(3, "walk forward"), (0, "walk forward")])
    assert lost[3].lost and "was replaced" in lost[3].message
    assert isinstance(lost[0], WorkerFailure) and not lost[0].lost  # slot 0: never reset
    assert not isinstance(pool.call("reset", [(3, (0, {"task_id": 1}))])[3], WorkerFailure)
    assert not isinstance(pool.call("step", [(3, "walk forward")])[3], WorkerFailure)


def episodes_of(rollout):
    """What a rollout played, episode by episode (its actions, rewards and ending)."""
    t = rollout.table
    return [(e.task_id, e.seed, e.traj, e.failed, e.won,
             [(t["action_text"][r], float(t["reward"][r])) for r in e.rows])
            for e in rollout.episodes]


def play_killing_worker_1(policy, tasks, rerun_lost: int):
    """``tasks`` in groups of 2 on two worker processes, worker 1 killed after the second
    round (its restart checked)."""
    import signal

    collector = Collector(EnvSection(id=CORRIDOR, kwargs={"split": "test"}, max_live_envs=4,
                                     workers=2, invalid_penalty=-0.1, rerun_lost=rerun_lost))
    rounds = []

    def kill_worker_1(n):
        rounds.append(n)
        if len(rounds) == 2:
            os.kill(collector.pool.pids()[1], signal.SIGKILL)

    try:
        faulty = collector.run(policy, tasks, 2, on_step=kill_worker_1)
        assert collector.pool.restarts == 1
    finally:
        collector.close()
    return faulty


@pytest.mark.parametrize("rerun", [0, 2])
def test_a_lost_workers_episodes_are_played_again_from_their_seeds(rerun):
    """A worker killed mid-collection: with env.rerun_lost its unfinished episodes are
    played again from their seeds elsewhere, and the rollout is the fault-free one; without
    it they are kept, failed, with the reason."""
    tasks = [(k, 70 + k) for k in range(3)]
    clean = play(make_policy("random", seed=4), tasks, group_size=2, workers=2)
    faulty = play_killing_worker_1(make_policy("random", seed=4), tasks, rerun)
    if rerun:
        assert episodes_of(faulty) == episodes_of(clean)
    else:
        lost = [e for e in faulty.episodes if e.failed]
        assert lost and all("env worker 1 died" in e.error for e in lost)
        assert len(lost) < len(faulty.episodes)


@pytest.mark.skipif(not has_module("torch"), reason="needs torch (the tiny model)")
def test_a_replayed_episode_equals_the_fault_free_one_to_float_rounding(tiny_model_path):
    """What env.rerun_lost makes equal, stated exactly: a lost worker's episodes replayed
    with a model policy have the fault-free run's actions, rewards and sampled tokens;
    their log-probs differ only by the rounding of another padded batch (< 1e-5)."""
    from gaca_agent.policies.hf import HFPolicy

    policy = HFPolicy(tiny_model_path, temperature=1.0, max_new_tokens=12,
                      history_length=0, device="cpu")
    tasks = [(k, 90 + k) for k in range(3)]
    clean = play(policy, tasks, group_size=2, workers=2)
    faulty = play_killing_worker_1(policy, tasks, rerun_lost=2)
    assert episodes_of(faulty) == episodes_of(clean)
    for a, b in zip(clean.episodes, faulty.episodes):
        for i, j in zip(a.rows, b.rows):
            assert list(clean.table["completion_ids"][i]) == \
                list(faulty.table["completion_ids"][j])
            assert np.allclose(clean.table["logprobs"][i], faulty.table["logprobs"][j],
                               rtol=0, atol=1e-5)


class Probe:
    """Plays given actions by step; answers with token ids (or none) and no NLLs."""

    def __init__(self, actions, ids=True):
        self.actions, self.ids, self.turns = actions, ids, []

    def act(self, turns):
        self.turns.extend(turns)
        out = []
        for t in turns:
            action = self.actions[min(t.step, len(self.actions) - 1)]
            out.append(ActionOutput(action.upper(), action, format_valid=t.step > 0,
                                    prompt_ids=[1, 2, t.step] if self.ids else None,
                                    completion_ids=[7, t.step] if self.ids else None,
                                    logprobs=[-0.5, -1.5] if self.ids else None))
        return out


def test_a_plain_envs_steps_and_ends_are_recorded_as_it_said():
    from gaca_envs.core import observation_key

    rollout = play(Probe(["finish"]), [(0, 1)], env_id=STALL, invalid_penalty=0.0)
    [ep], t = rollout.episodes, rollout.table
    assert (ep.won, ep.score, ep.failed, ep.final_observation) == (True, 0.75, False, "done")
    assert t["action_valid"].tolist() == [True]  # an env that says nothing: valid
    assert t["state_key"][0] == observation_key("ready")  # no state keys: observations
    assert t["next_state_key"][0] == observation_key("done")
    assert t["admissible_actions"][0] == ("stall", "explode", "finish", "lose", "broken")
    assert t["info"][0] == {"score": 0.75} and t["format_valid"].tolist() == [False]
    assert t["prompt_ids"][0].tolist() == [1, 2, 0] and t["completion_ids"][0].tolist() == [7, 0]
    assert t["logprobs"][0].tolist() == [-0.5, -1.5]
    assert (t["nll"][0], t["nll_response"][0], t["nll_action"][0], t["nll_think"][0]) == \
        (0.0, 0.0, 0.0, 0.0)  # a policy without NLLs
    broken = play(Probe(["broken"]), [(0, 1)], env_id=STALL)
    assert broken.episodes[0].failed and broken.episodes[0].error == "engine broke"
    assert broken.table["info"][0] == {"error": "engine broke"}
    assert not broken.episodes[0].won and broken.episodes[0].score == 0.0
    failed = play(Probe(["walk forward"]), [(99, 1)])  # a reset the env refuses
    assert failed.episodes[0].failed and "99" in failed.episodes[0].error
    assert failed.episodes[0].length == 0


def test_the_reward_is_the_envs_own_or_success_as_the_section_says():
    for action, env_reward, success in (("lose", 0.5, 0.0), ("finish", 1.0, 1.0)):
        for mode, expected in (("env", env_reward), ("success", success)):
            rollout = play(Probe([action]), [(0, 1)], env_id=STALL, invalid_penalty=0.0,
                           reward=mode, reward_scale=10)
            assert rollout.table["reward"].tolist() == [10 * expected], (action, mode)
            assert rollout.episodes[0].total_reward == 10 * expected
            assert rollout.episodes[0].won is (action == "finish")


def test_actions_code_case_blind_and_truncation_is_recorded():
    rollout = play(Probe(["Walk Forward", "walk forward", "rest"]), [(0, 2)],
                   env_id=CORRIDOR)
    t = rollout.table
    assert t["action"][0] == t["action"][1]  # the same action, whatever its case
    assert t["truncated"][-1] and not t["terminal"][-1]  # resting until the step limit
    assert rollout.episodes[0].length == 40 and not rollout.episodes[0].won


def test_a_lost_episode_earns_nothing_under_the_success_reward():
    class Contrary:  # the expert, except at doors: the other door
        needs_expert = True

        def act(self, turns):
            out = []
            for t in turns:
                action = t.expert_action
                if "door" in t.observation.lower():
                    action = next(a for a in t.admissible_actions if a != t.expert_action)
                out.append(ActionOutput(format_response(action), action))
            return out

    rollout = play(Contrary(), [(0, 3)], env_id="gaca/Diag-Signs-v0", reward="success",
                   invalid_penalty=0.0)
    [ep], t = rollout.episodes, rollout.table
    assert t["terminal"][-1] and not ep.won and ep.score == 0.0
    assert t["reward"].tolist() == [0.0] * len(t) and ep.total_reward == 0.0


def test_turns_carry_the_env_family_prompt_history_and_expert_only_when_asked():
    class NoFlags:  # a policy that says nothing about experts
        def __init__(self):
            self.turns = []

        def act(self, turns):
            self.turns.extend(turns)
            return [ActionOutput(format_response("walk forward"), "walk forward")
                    for _ in turns]

    policy = NoFlags()
    section = EnvSection(id=CORRIDOR, kwargs={"split": "test"}, workers=0, history_length=1,
                         max_live_envs=2)
    collector = Collector(section)
    try:
        collector.run(policy, [(0, 1)], 1)
        assert collector.pool.expert is False
        assert all(t.expert_action is None for t in policy.turns)  # not asked for
        assert all(t.family == "generic" for t in policy.turns)  # Diag's prompts
        assert collector.prompts.history_length == 1
        text = collector.prompts.build(policy.turns[3])
        assert policy.turns[3].history[-1][0] in text and policy.turns[3].history[0][0] \
            not in text  # one step of history shown
        collector.run(make_policy("expert"), [(0, 1)], 1)
        assert collector.pool.expert is True
    finally:
        collector.close()


def test_each_env_gets_its_prompt_family_or_the_users_template(tmp_path):
    assert Collector(EnvSection(id="gaca/WebShop-v0")).family == "webshop"
    assert Collector(EnvSection(id="gaca/ALFWorld-v0")).family == "alfworld"
    mine = tmp_path / "mine.txt"
    mine.write_text("{task}\n{observation}\n{actions}")
    assert Collector(EnvSection(id=CORRIDOR, template_file=str(mine))).prompts \
        .template_file == str(mine)


def test_a_policy_that_answers_the_wrong_number_of_turns_stops_collection():
    class Short:
        needs_expert = False

        def act(self, turns):
            return [ActionOutput("x", "x")] * (len(turns) - 1)

    with pytest.raises(RuntimeError, match="policy returned 1 outputs for 2 turns"):
        play(Short(), [(0, 1), (1, 2)])


def test_the_env_token_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("GACA_ENV_TOKEN", "s3cret")
    assert Collector(EnvSection(id=CORRIDOR)).token == "s3cret"
    assert Collector(EnvSection(id=CORRIDOR), token="given").token == "given"
    assert Collector(EnvSection(id=CORRIDOR), token="").token == ""
    monkeypatch.delenv("GACA_ENV_TOKEN")
    assert Collector(EnvSection(id=CORRIDOR)).token is None


def test_slots_freed_together_are_refilled_and_a_failed_reset_frees_its_slot():
    expert = make_policy("expert")
    # two live slots, three episodes of one task: both slots free at the same step and
    # only one episode is left to start
    same = play(expert, [(0, 1), (0, 2), (0, 3)], max_live_envs=2)
    assert [e.won for e in same.episodes] == [True] * 3
    # a reset the env refuses, beside ones it takes: the others play on
    mixed = play(expert, [(99, 1), (0, 2), (1, 3)], max_live_envs=3)
    assert [e.failed for e in mixed.episodes] == [True, False, False]
    assert all(e.won for e in mixed.episodes[1:]) and mixed.episodes[0].length == 0
    assert mixed.train_rows.tolist() == list(range(len(mixed.table)))
    # one slot whose reset fails: no episode is live that round, the queue still plays
    alone = play(expert, [(99, 1), (0, 2)], max_live_envs=1)
    assert [(e.failed, e.won) for e in alone.episodes] == [(True, False), (False, True)]


def test_close_stops_the_workers_and_the_collector_plays_again():
    section = EnvSection(id=CORRIDOR, kwargs={"split": "test"}, workers=1, max_live_envs=1)
    collector = Collector(section)
    try:
        first = collector.run(make_policy("expert"), [(0, 1)])
        [pid] = collector.pool.pids()
        collector.close()
        with pytest.raises(ProcessLookupError):  # reaped, not left running
            os.kill(pid, 0)
        again = collector.run(make_policy("expert"), [(0, 1)])  # a fresh pool
        assert collector.pool.pids() != [pid]
        assert again.table["reward"].tolist() == first.table["reward"].tolist()
    finally:
        collector.close()
        collector.close()  # twice is harmless
    one = LocalPool(CORRIDOR, {"split": "test"}, num_envs=1)
    assert one.call("reset", [(0, (0, None))])[0][1]["task_id"] >= 0
    one.close()


def test_a_rank_with_no_task_groups_returns_an_empty_rollout():
    rollout = play(make_policy("random"), [], group_size=4)
    assert rollout.episodes == [] and len(rollout.table) == 0


def test_each_step_records_the_weight_version_that_sampled_it():
    """Turns carry the version their episode is pinned to; a step's policy_version is the
    policy's own word when it gives one, else the pinned version, else -1 (unknown), and
    the rows handed out as episodes end say the same (without the key when unknown)."""
    class Versioned:  # the expert; reports version 7 on odd steps
        needs_expert = True

        def __init__(self):
            self.turns = []

        def act(self, turns):
            self.turns.extend(turns)
            return [ActionOutput(format_response(t.expert_action), t.expert_action,
                                 extra={"policy_version": 7} if t.step % 2 else {})
                    for t in turns]

    section = EnvSection(id=CORRIDOR, kwargs={"split": "test"}, workers=0, max_live_envs=2)
    collector = Collector(section)
    try:
        for pinned in (3, None):
            policy, rows = Versioned(), []
            rollout = collector.run(policy, [(0, 1), (1, 2)], 2, version=pinned,
                                    on_episode=lambda ep, r: rows.extend(r))
            t = rollout.table
            base = -1 if pinned is None else pinned
            assert t["policy_version"].tolist() == [7 if s % 2 else base for s in t["t"]]
            assert {turn.version for turn in policy.turns} == {pinned}
            assert sorted(r.get("policy_version", -1) for r in rows) == \
                sorted(t["policy_version"].tolist())
    finally:
        collector.close()
