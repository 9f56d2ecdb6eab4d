"""ScienceWorld engines sharing a JVM play exactly as engines in JVMs of their own.

The reference is the ``scienceworld`` package's own layout: its ``ScienceWorldEnv`` starts
a JVM per env and makes the engine in the JVM's own class loader (run here with our JVM
flags). Several of our envs on one JVM are stepped in turn, one step each, so that any
state the engines shared (the engine's random generator, its object-id counter, its
type-id table) would show.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import gymnasium as gym
import pytest

import gaca_envs
from gaca_envs.scienceworld import jvm
from gaca_envs.scienceworld.env import ScienceWorldError

from test_scienceworld import _engine_or_skip

gym.register_envs(gaca_envs)


class PackageEngine:
    """The package's own engine, in a JVM of its own, as the env used it before."""

    def __init__(self, *_args) -> None:
        from scienceworld import ScienceWorldEnv

        self._env = ScienceWorldEnv("", envStepLimit=sys.maxsize)
        self.server, self.getObjectTree = self._env.server, self._env.getObjectTree
        self.pid = self._env._gateway.java_process.pid

    def alive(self) -> bool:
        return jvm.process_alive(self._env._gateway.java_process)

    def close(self) -> None:
        self._env.close()
        self._env.close = lambda: None  # its __del__ closes again


def episode(env, task_id: int, mode: str, steps: int, seed: int):
    """Yield a row per step of one episode: ``gold`` follows the expert (a random
    admissible action once it has none), ``random`` plays random admissible actions."""
    rng = random.Random(seed)
    obs, info = env.reset(options={"task_id": task_id})
    yield ("reset", obs, info["admissible_actions"], info["state_key"])
    for _ in range(steps):
        action = env.unwrapped.expert_action() if mode == "gold" else None
        action = action or rng.choice(sorted(info["admissible_actions"]))
        obs, reward, term, trunc, info = env.step(action)
        yield (action, obs, reward, term, info["admissible_actions"], info["state_key"],
               info["score"], info["action_valid"])
        if term or trunc:
            return


def plays(env, plan):
    for task_id, mode, steps, seed in plan:
        yield from episode(env, task_id, mode, steps, seed)


def make(task_types: str, **kwargs):
    """An env of the test split over ``task_types`` ("": every task type)."""
    return gym.make("gaca/ScienceWorld-v0", split="test", task_types=task_types or None,
                    max_episode_steps=None, **kwargs)


def own_jvms(task_types: str, plans, monkeypatch) -> list[list[tuple]]:
    with monkeypatch.context() as m:
        m.setattr("gaca_envs.scienceworld.env.acquire", PackageEngine)
        m.setenv("JAVA_TOOL_OPTIONS", " ".join(jvm.JVM_OPTIONS))  # the same JVM flags
        rows = []
        for plan in plans:
            env = make(task_types)
            try:
                rows.append(list(plays(env, plan)))
            finally:
                env.close()
    return rows


def one_jvm(task_types: str, plans) -> list[list[tuple]]:
    envs = [make(task_types, envs_per_jvm=len(plans)) for _ in plans]
    try:
        assert len({e.unwrapped._engine.pid for e in envs}) == 1  # one JVM holds them all
        games = [plays(e, plan) for e, plan in zip(envs, plans)]
        rows: list[list[tuple]] = [[] for _ in plans]
        live = set(range(len(plans)))
        while live:  # one step of each env in turn
            for i in sorted(live):
                row = next(games[i], None)
                if row is None:
                    live.discard(i)
                else:
                    rows[i].append(row)
        return rows
    finally:
        for e in envs:
            e.close()


def first_test_variations(task_types: str) -> dict[str, int]:
    env = make(task_types)
    try:
        first: dict[str, int] = {}
        for k, v in enumerate(env.unwrapped.variations):
            first.setdefault(v.task_type, k)
        return first
    finally:
        env.close()


def assert_same(task_types: str, plans, monkeypatch) -> None:
    reference = own_jvms(task_types, plans, monkeypatch)
    shared = one_jvm(task_types, plans)
    for i, (want, got) in enumerate(zip(reference, shared)):
        assert len(got) == len(want), i
        for k, (a, b) in enumerate(zip(want, got)):
            assert a == b, (i, k, a[0], b[0])


def test_engines_sharing_a_jvm_play_as_in_jvms_of_their_own(monkeypatch):
    """Bees (grow-fruit, genetics) draw from the engine's random generator every tick: a
    generator shared by the engines of one JVM would give other worlds here."""
    _engine_or_skip()
    types = "boil,grow-fruit,chemistry-mix,mendelian-genetics-known-plant,find-animal"
    first = first_test_variations(types)
    plans = [[(first["chemistry-mix"], "gold", 40, 0), (first["grow-fruit"], "random", 25, 1)],
             [(first["grow-fruit"], "random", 30, 2), (first["find-animal"], "gold", 30, 3)],
             [(first["mendelian-genetics-known-plant"], "random", 25, 4),
              (first["boil"], "random", 20, 5)]]
    assert_same(types, plans, monkeypatch)


@pytest.mark.slow
def test_every_task_type_on_a_shared_jvm_plays_as_on_its_own(monkeypatch):
    """Gold paths (up to 120 steps) and random play of the first test variation of a fifth
    of the task types (every fifth; all 30 with GACA_TEST_ALL_TASK_TYPES=1, about 22
    minutes on 2 cores), four envs on one JVM against four package JVMs."""
    _engine_or_skip()
    first = list(first_test_variations("").values())
    assert len(first) == 30
    if os.environ.get("GACA_TEST_ALL_TASK_TYPES") != "1":
        first = first[::5]
    plans: list[list] = [[] for _ in range(4)]
    for n, task_id in enumerate(first):
        plans[n % 4] += [(task_id, "gold", 120, n), (task_id, "random", 15, n)]
    assert_same("", plans, monkeypatch)


def _gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``seconds``."""
    for _ in range(int(seconds / 0.05)):
        if not jvm.running(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_jvm_is_dead_once_reaped_while_another_thread_waits_on_it():
    """py4j's ProcessConsumer thread waits on the JVM's process, holding Popen's wait
    lock; a JVM it has just reaped must read as dead (poll() alone says alive), or the
    dead JVM's envs raise raw py4j errors instead of failing their episode."""
    import subprocess

    host = object.__new__(jvm.JvmHost)
    host._proc = subprocess.Popen(["sleep", "60"])
    assert host.alive()
    with host._proc._waitpid_lock:  # as the consumer thread holds it inside wait()
        host._proc.kill()
        os.waitpid(host._proc.pid, 0)  # reaped, its return code not yet recorded
        assert not host.alive()
    assert not jvm.running(host._proc.pid) and jvm.running(os.getpid())


def test_a_dead_jvm_fails_only_its_own_envs_and_they_recover_at_reset():
    _engine_or_skip()
    a, b, c = (make("boil", envs_per_jvm=2) for _ in range(3))
    try:
        pids = [e.unwrapped._engine.pid for e in (a, b, c)]
        assert pids[0] == pids[1] != pids[2]  # two per JVM
        for e in (a, b, c):
            e.reset(options={"task_id": 0})
        os.kill(pids[0], signal.SIGKILL)
        assert _gone(pids[0])
        for e in (a, b):
            with pytest.raises(ScienceWorldError, match=f"JVM \\(pid {pids[0]}\\) died"):
                e.step("open door to kitchen")  # the episode fails
        assert c.step("open door to kitchen")[4]["action_valid"]  # c plays on
        obs, info = a.reset(options={"task_id": 0})  # a new engine, on c's JVM (room left)
        assert a.unwrapped._engine.pid == pids[2] and a.unwrapped._engine.alive()
        b.reset(options={"task_id": 0})  # c's JVM is full: b's new engine starts one
        new_pid = b.unwrapped._engine.pid
        assert new_pid not in pids and b.unwrapped._engine.alive()
        fresh = make("boil", envs_per_jvm=1)
        try:
            obs_fresh, info_fresh = fresh.reset(options={"task_id": 0})
            assert (obs, info["state_key"]) == (obs_fresh, info_fresh["state_key"])
        finally:
            fresh.close()
        assert a.step("open door to kitchen")[4]["action_valid"]
    finally:
        for e in (a, b, c):
            e.close()
    assert not jvm.hosts()  # every JVM shut down with its last engine
    for pid in {*pids, new_pid}:
        assert _gone(pid), pid
