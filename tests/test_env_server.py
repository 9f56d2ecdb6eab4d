"""Environments over the network: gaca-env-serve (OpenEnv), gaca/Remote-v0, the collector
on env servers, gaca/AgentGym-v0."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import gymnasium as gym
import numpy as np
import pytest

import gaca_envs
from gaca_envs.remote.client import RemoteEnvError

from conftest import (alfworld_data_or_skip, free_port, has_module, start_env_server,
                      stop_at_first_checkpoint, stop_env_server)

gym.register_envs(gaca_envs)
pytestmark = pytest.mark.skipif(
    not (has_module("openenv") and has_module("uvicorn") and has_module("websockets")),
    reason="needs the envserver extra (pip install -e '.[envserver]')")


def http(url, method="GET", body=None, token=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def chunked_post(url, chunks, token):
    """POST ``chunks`` with chunked transfer encoding (no Content-Length)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", parts.path, body=iter(chunks), encode_chunked=True,
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def play_both(local, remote, seed, task_id, steps, rng):
    """Reset both on (seed, task) and step both with the same actions (admissible ones,
    one that is not, and steps after the end); every return value must be equal."""
    a, b = local.reset(seed=seed, options={"task_id": task_id}), \
        remote.reset(seed=seed, options={"task_id": task_id})
    assert a == b
    info = a[1]
    for t in range(steps):
        acts = info["admissible_actions"]
        action = "not an action at all" if t == 1 or not acts else acts[rng.integers(len(acts))]
        a, b = local.step(action), remote.step(action)
        assert a == b, (t, action)
        info = a[4]
    return a


@pytest.mark.parametrize("env_id,kwargs", [
    ("gaca/Diag-Signs-v0", {"split": "test"}),
    ("gaca/WebShop-v0", {"split": "test"}),
    ("gaca/ALFWorld-v0", {"split": "valid_seen"}),
])
def test_remote_env_equals_the_local_env_step_by_step(env_id, kwargs):
    spec = gaca_envs.registration.spec_of(env_id)
    if any(not has_module(m) for m in spec.requires):
        pytest.skip(f"{env_id} needs {list(spec.requires)}")
    if env_id == "gaca/ALFWorld-v0":
        kwargs = {**kwargs, "data_dir": str(alfworld_data_or_skip())}
    proc, url = start_env_server(env_id, *[f"{k}={v}" for k, v in kwargs.items()])
    local = gym.make(env_id, **kwargs)
    remote = gym.make("gaca/Remote-v0", url=url, env_kwargs={"split": kwargs["split"]})
    try:
        assert remote.unwrapped.num_tasks == local.unwrapped.num_tasks
        rng = np.random.default_rng(0)
        for seed, task in ((3, 0), (4, 2)):
            play_both(local, remote, seed, task, 6 if env_id == "gaca/ALFWorld-v0" else 18, rng)
        # a finished episode answers the same on both sides (no-op steps after the end)
        if env_id != "gaca/ALFWorld-v0":
            final = play_both(local, remote, 5, 1, 60, rng)
            assert final[2] or final[3]
    finally:
        remote.close()
        local.close()
        stop_env_server(proc)


def test_errors_reach_the_client_as_clear_messages(diag_server):
    env = gym.make("gaca/Remote-v0", url=diag_server)
    try:
        with pytest.raises(RemoteEnvError, match="task_id must be an int in range"):
            env.reset(options={"task_id": 10**6})
        with pytest.raises(RemoteEnvError, match="unknown reset option"):
            env.reset(options={"level": 3})
        env.reset(seed=1)  # the session survives its errors
    finally:
        env.close()
    fixed = gym.make("gaca/Remote-v0", url=diag_server, env_kwargs={"world": "corridor"})
    with pytest.raises(RemoteEnvError, match="fixed by this server"):
        fixed.reset(seed=0)
    fixed.close()
    bad_split = gym.make("gaca/Remote-v0", url=diag_server, env_kwargs={"split": "nope"})
    with pytest.raises(RemoteEnvError, match="nope"):
        bad_split.reset(seed=0)
    bad_split.close()
    # OpenEnv's HTTP /step is stateless: a clear 400, no traceback
    status, body = http(diag_server + "/step", "POST", {"action": {"action": "rest"}})
    assert status == 400 and "/ws" in body["detail"] and "Traceback" not in body["detail"]
    status, body = http(diag_server + "/reset", "POST", {"seed": 1})
    assert status == 200 and body["observation"]["state_key"]


def test_openenv_own_client_gets_our_observations_and_state_keys(diag_server):
    """What a TRL/SkyRL user sees: OpenEnv's GenericEnvClient against gaca-env-serve."""
    from openenv.core.generic_client import GenericEnvClient

    local = gym.make("gaca/Diag-Signs-v0")
    obs, info = local.reset(seed=7, options={"task_id": 3})
    with GenericEnvClient(base_url=diag_server).sync() as client:
        result = client.reset(seed=7, options={"task_id": 3})
        got = result.observation
        assert got["text"] == obs and got["state_key"] == info["state_key"]
        assert got["admissible_actions"] == list(info["admissible_actions"])
        action = info["admissible_actions"][0]
        obs, reward, terminated, truncated, info = local.step(action)
        result = client.step({"action": action})
        assert result.observation["text"] == obs
        assert result.observation["state_key"] == info["state_key"]
        assert result.reward == reward and result.done == (terminated or truncated)
        state = client.state()
        assert state["step_count"] == 1 and state["state_key"] == info["state_key"]
    status, schema = http(diag_server + "/schema")
    assert status == 200 and "state_key" in schema["observation"]["properties"]
    assert http(diag_server + "/metadata")[1]["name"] == "gaca/Diag-Signs-v0"


def test_sessions_are_bounded_closed_and_reaped():
    proc, url = start_env_server("gaca/Diag-Corridor-v0", "--max-sessions", "2",
                                 "--idle-timeout", "2")
    try:
        a, b, c = (gym.make("gaca/Remote-v0", url=url) for _ in range(3))
        a.reset(seed=0)
        b.reset(seed=0)
        assert {k: v for k, v in http(url + "/sessions")[1].items() if k != "opened"} == \
            {"active": 2, "max": 2}
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            c.reset(seed=0)
        a.close()
        time.sleep(0.3)
        c.reset(seed=0)  # a's place was freed by its close
        b.close()
        c.close()
        time.sleep(0.3)
        assert http(url + "/sessions")[1]["active"] == 0
        # an idle session is closed by the server (reaper: every max(timeout/4, 5) s)
        d = gym.make("gaca/Remote-v0", url=url)
        d.reset(seed=0)
        assert http(url + "/sessions")[1]["active"] == 1
        deadline = time.time() + 20
        while time.time() < deadline and http(url + "/sessions")[1]["active"]:
            time.sleep(0.5)
        assert http(url + "/sessions")[1]["active"] == 0
        d.close()
    finally:
        stop_env_server(proc)


def test_closing_a_session_closes_its_env():
    from gaca_envs.remote.service import ServeSettings, make_environment_class

    env_class = make_environment_class(ServeSettings("gaca/Diag-Corridor-v0",
                                                     {"split": "test"}))[0]
    session = env_class()
    session.reset(seed=0)
    inner, calls = session._env, []
    real_close = inner.close
    inner.close = lambda: (calls.append(1), real_close())
    session.close()
    assert calls == [1] and session._env is None
    session.close()  # a second close is harmless and closes nothing twice
    assert calls == [1]


def test_token_size_limit_and_loopback_rule():
    from gaca_envs.remote.service import main

    with pytest.raises(SystemExit) as stop:  # off loopback without a token: refused
        main(["gaca/Diag-Signs-v0", "--host", "0.0.0.0"])
    assert stop.value.code == 2
    proc, url = start_env_server("gaca/Diag-Signs-v0", "--token", "s3cret",
                                 "--max-request-bytes", "4096")
    try:
        assert http(url + "/health")[0] == 401
        assert http(url + "/health", token="wrong")[0] == 401
        assert http(url + "/health", token="s3cret")[0] == 200
        status, body = http(url + "/reset", "POST", token="s3cret",
                            raw=json.dumps({"seed": 1, "pad": "x" * 10_000}).encode())
        assert status == 413 and "4096" in body["detail"]
        # the limit is exact: 4,096 bytes pass (JSON padded with spaces), 4,097 do not
        exact = json.dumps({"seed": 1}).encode().ljust(4096)
        assert http(url + "/reset", "POST", token="s3cret", raw=exact)[0] == 200
        assert http(url + "/reset", "POST", token="s3cret", raw=exact + b" ")[0] == 413
        # and it holds for a body sent in chunks, without a Content-Length
        assert chunked_post(url + "/reset", [exact[:2000], exact[2000:]], "s3cret")[0] == 200
        status, body = chunked_post(url + "/reset", [exact, b" " * 10], "s3cret")
        assert status == 413 and "4096" in body["detail"]
        with pytest.raises(RemoteEnvError, match="cannot open a session"):
            gym.make("gaca/Remote-v0", url=url).reset(seed=0)
        env = gym.make("gaca/Remote-v0", url=url, token="s3cret")
        env.reset(seed=0)
        env.close()
    finally:
        stop_env_server(proc)


def _collect(config, tasks, group_size=2, on_step=None):
    from gaca_agent.policies import make_policy
    from gaca_agent.collect.collector import Collector

    collector = Collector(config)
    try:
        return collector.run(make_policy("random", seed=3), tasks, group_size, on_step=on_step)
    finally:
        collector.close()


def _summary(rollout):
    return [(e.task_id, e.seed, e.failed, e.length, e.total_reward) for e in rollout.episodes]


def test_collector_on_two_servers_plays_what_local_workers_play():
    from gaca_agent.config import EnvSection

    servers = [start_env_server("gaca/Diag-Signs-v0") for _ in range(2)]
    try:
        tasks = [(k, 100 + k) for k in range(6)]
        local = _collect(EnvSection(id="gaca/Diag-Signs-v0", kwargs={"split": "test"}, workers=2,
                                    max_live_envs=6, invalid_penalty=0.0), tasks)
        remote = _collect(EnvSection(id="gaca/Diag-Signs-v0", kwargs={"split": "test"},
                                     max_live_envs=6, servers=[u for _, u in servers],
                                     invalid_penalty=0.0), tasks)
        assert _summary(local) == _summary(remote)
        assert not any(e.failed for e in remote.episodes)
        for col in ("state_key", "reward", "action"):
            assert list(local.table[col]) == list(remote.table[col]), col
        for _, url in servers:  # both played, and every session was closed
            counts = http(url + "/sessions")[1]
            assert counts["active"] == 0 and counts["opened"] >= 3, (url, counts)
    finally:
        for proc, _ in servers:
            stop_env_server(proc)


def test_a_server_killed_mid_collection_fails_only_its_live_episodes():
    from gaca_agent.config import EnvSection

    servers = [start_env_server("gaca/Diag-Signs-v0") for _ in range(2)]
    victim = servers[1][0]
    rounds = []

    def kill_after_three(n):
        rounds.append(n)
        if len(rounds) == 3:
            victim.kill()

    try:
        tasks = [(k % 16, 200 + k) for k in range(12)]
        rollout = _collect(EnvSection(id="gaca/Diag-Signs-v0", kwargs={"split": "test"},
                                      max_live_envs=4, timeout_s=60,
                                      servers=[u for _, u in servers], invalid_penalty=0.0),
                           tasks, on_step=kill_after_three)
        episodes = rollout.episodes
        assert len(episodes) == 24  # nothing dropped
        failed = [e for e in episodes if e.failed]
        assert 1 <= len(failed) <= 2  # the victim's live episodes (slots 1 and 3)
        assert all(servers[1][1] in e.error for e in failed)
        assert sum(not e.failed for e in episodes) == 24 - len(failed)
        # with env.rerun_lost, a dying server's episodes play again on the living one
        clean = _collect(EnvSection(id="gaca/Diag-Signs-v0", kwargs={"split": "test"},
                                    max_live_envs=4, workers=0, invalid_penalty=0.0), tasks)
        servers.append(start_env_server("gaca/Diag-Signs-v0"))
        victim, rounds[:] = servers[2][0], []
        replayed = _collect(EnvSection(id="gaca/Diag-Signs-v0", kwargs={"split": "test"},
                                       max_live_envs=4, timeout_s=60, rerun_lost=2,
                                       servers=[servers[0][1], servers[2][1]],
                                       invalid_penalty=0.0), tasks, on_step=kill_after_three)
        assert victim.poll() is not None  # it died mid-collection
        assert _summary(replayed) == _summary(clean)
    finally:
        for proc, _ in servers:
            stop_env_server(proc)


def test_gaca_eval_on_env_servers(tmp_path, diag_server):
    from dataclasses import replace

    from gaca_agent.eval.evaluate import Evaluation, evaluate

    for policy in ("random", "expert"):  # the expert's actions come from the server
        ev = Evaluation("gaca/Diag-Signs-v0", policy, 6, {"split": "test"})
        local = evaluate(ev, tmp_path / f"{policy}-a", progress=False)
        remote = evaluate(replace(ev, env_servers=(diag_server,)), tmp_path / f"{policy}-b",
                          progress=False)
        for key in ("n", "failed", "success_rate", "mean_score", "mean_steps"):
            assert local[key] == remote[key], (policy, key)
    assert remote["success_rate"] == 1.0


@pytest.mark.slow
def test_gaca_train_with_two_env_servers_matches_local_workers(tmp_path):
    import subprocess
    import sys

    if not (has_module("torch") and has_module("transformers")):
        pytest.skip("needs the train extra")
    servers = [start_env_server("gaca/Diag-Signs-v0") for _ in range(2)]
    small = ["iterations=2", "eval_every=2", "env.eval_episodes=8", "env.groups=2",
             "env.group_size=2", "env.max_live_envs=4", "warmup.bc_steps=10",
             "warmup.bc_episodes=4", "model.max_new_tokens=12", "learner.micro_batch_size=8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    try:
        urls = ",".join(u for _, u in servers)
        runs = {}
        for name, extra in (("local", ["env.workers=2"]), ("remote", [f"env.servers=[{urls}]"])):
            done = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress",
                                   "--config", "default",
                                   f"out_dir={tmp_path}", f"name={name}", *small, *extra],
                                  env=env, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, done.stderr[-3000:]
            rows = [json.loads(x) for x in
                    (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            runs[name] = [{k: v for k, v in r.items() if not k.startswith("perf/")}
                          for r in rows]
        for _, url in servers:  # the remote run really played on both servers
            assert http(url + "/sessions")[1]["opened"] >= 2, url
        assert len(runs["local"]) == len(runs["remote"]) >= 3
        for a, b in zip(runs["local"], runs["remote"]):
            assert set(a) == set(b)
            for key, value in a.items():
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    finally:
        for proc, _ in servers:
            stop_env_server(proc)


@pytest.mark.slow
def test_gaca_train_stops_in_one_line_when_its_env_server_dies_and_resumes(tmp_path):
    """The only env server is killed during iteration 2: after env.timeout_s the run stops
    with one line naming the cause and the intact checkpoint; with the server back,
    --resume finishes it with the metrics of an undisturbed run (local workers)."""
    import subprocess
    import sys

    from gaca_envs.remote.launch import start_process

    if not (has_module("torch") and has_module("transformers")):
        pytest.skip("needs the train extra")
    small = ["iterations=3", "eval_every=0", "checkpoint_every=1", "env.groups=2",
             "env.group_size=2", "env.max_live_envs=4", "warmup.bc_steps=10",
             "warmup.bc_episodes=4", "model.max_new_tokens=12", "learner.micro_batch_size=8",
             "env.timeout_s=5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

    def train(*extra, wait=True):
        cmd = [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", *extra]
        if wait:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                                  cwd=tmp_path)
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path)

    common = ["--config", "default", f"out_dir={tmp_path}", *small]
    local = train(*common, "name=local", "env.workers=2")
    assert local.returncode == 0, local.stderr[-3000:]
    port = free_port()
    server, url = start_process("gaca/Diag-Signs-v0", port=port)
    run = train(*common, "name=remote", f"env.servers=[{url}]", wait=False)
    stopped, error = stop_at_first_checkpoint(run, tmp_path / "remote", server, 3)
    assert "every env server has been down" in error and url in error, error
    server, _ = start_process("gaca/Diag-Signs-v0", port=port)
    try:
        resumed = train("--resume", str(tmp_path / "remote"))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        stop_env_server(server)

    def rows(name):
        return {r["iteration"]: {k: v for k, v in r.items() if not k.startswith("perf/")}
                for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text()
                             .splitlines())}

    a, b = rows("local"), rows("remote")
    assert sorted(a) == sorted(b) == [-1, 0, 1, 2]
    for it in range(stopped - 1, 3):  # the iterations the resumed run played
        for key, value in a[it].items():
            assert b[it][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (it, key)


# ---------------------------------------------------------------- AgentGym's protocol
def agentgym_server(with_actions: bool = True, other_spelling: bool = False):
    """A small server speaking AgentGym's HTTP env protocol (AgentGym's own servers are not
    installable here): count to a target with 'add 1' / 'add 2'; data_idx is the target.
    ``with_actions=False``: no ``/available_actions`` (as some AgentGym servers);
    ``other_spelling``: ``env_id`` for ``id``, ``task_description`` for ``goal``, and the
    observation in the reset's answer instead of ``/observation`` (as others)."""
    import uvicorn
    from fastapi import Body, FastAPI

    app = FastAPI()
    envs: dict[int, dict] = {}

    @app.post("/create")
    def create():
        envs[len(envs)] = {"target": 0, "total": 0, "done": False}
        return {"env_id" if other_spelling else "id": len(envs) - 1}

    @app.post("/reset")
    def reset(body: dict = Body()):
        if body["id"] not in envs:
            return {"error": f"env {body['id']} does not exist"}
        envs[body["id"]].update(target=3 + body["data_idx"], total=0, done=False)
        if other_spelling:
            return {"task_description": f"reach {3 + body['data_idx']}",
                    "observation": f"total 0 of {3 + body['data_idx']}"}
        return {"goal": f"reach {3 + body['data_idx']}"}

    if not other_spelling:
        @app.get("/observation")
        def observation(id: int):
            e = envs[id]
            return f"total {e['total']} of {e['target']}"

    if with_actions:
        @app.get("/available_actions")
        def available_actions(id: int):
            if envs[id]["done"]:  # as servers whose episode is over
                return {"error": "the episode is over"}
            return ["add 1", "add 2"]

    @app.post("/step")
    def step(body: dict = Body()):
        e = envs[body["id"]]
        e.setdefault("sent", []).append(body["action"])
        if body["action"] in ("add 1", "add 2"):
            e["total"] += int(body["action"][-1])
        e["done"] = e["total"] >= e["target"]
        reward = 1.0 if e["total"] == e["target"] else 0.0
        return {"observation": f"total {e['total']} of {e['target']}", "reward": reward,
                "done": e["done"]}

    @app.post("/close")
    def close(body: dict = Body()):
        envs.pop(body["id"], None)
        return {"closed": True}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}", envs


def test_agentgym_client_plays_an_agentgym_protocol_server(tmp_path):
    from gaca_agent.eval.evaluate import Evaluation, evaluate

    server, url, envs = agentgym_server()
    try:
        env = gym.make("gaca/AgentGym-v0", url=url, env="counter", num_tasks=3,
                       render_mode="ansi")
        obs, info = env.reset(seed=0, options={"task_id": 1})
        assert obs == "total 0 of 4" and info["task"] == "reach 4" and info["task_id"] == 1
        assert env.render() == obs
        assert info["admissible_actions"] == ("add 1", "add 2")
        assert info["state_key_source"] == "observation"
        obs, reward, terminated, truncated, info = env.step("add 2")
        assert (obs, reward, terminated, info["won"]) == ("total 2 of 4", 0.0, False, False)
        obs, reward, terminated, truncated, info = env.step("add 2")
        assert (reward, terminated, info["won"], info["admissible_actions"]) == \
            (1.0, True, True, ())
        assert env.step("add 1")[1:3] == (0.0, True)  # after the end: a no-op
        with pytest.raises(ValueError, match="task_id"):
            env.reset(options={"task_id": 3})
        env.close()
        assert envs == {}  # the server-side env was closed
        # our evaluation tools run on it (random policy, worker processes)
        results = evaluate(Evaluation("gaca/AgentGym-v0", "random", 6,
                                      {"url": url, "num_tasks": 3}), tmp_path / "eval",
                           progress=False)
        assert results["n"] == 6 and results["failed"] == 0
    finally:
        server.should_exit = True


def test_agentgym_server_without_an_action_list_gets_the_text_as_typed():
    """A server that lists no actions is sent whatever the agent typed (case kept); one
    that lists them only gets admissible actions (the env contract's no-op otherwise)."""
    server, url, envs = agentgym_server(with_actions=False, other_spelling=True)
    try:
        env = gym.make("gaca/AgentGym-v0", url=url, num_tasks=3)
        obs, info = env.reset(seed=0, options={"task_id": 0})
        assert (obs, info["task"]) == ("total 0 of 3", "reach 3")  # the other spelling
        assert info["admissible_actions"] == ()
        _, _, _, _, info = env.step("Add 1")
        assert info["action_valid"] and envs[0]["sent"] == ["Add 1"]
        env.close()
    finally:
        server.should_exit = True
    server, url, envs = agentgym_server(with_actions=True)
    try:
        env = gym.make("gaca/AgentGym-v0", url=url, num_tasks=3)
        env.reset(seed=0, options={"task_id": 0})
        obs, reward, _, _, info = env.step("jump")
        assert not info["action_valid"] and "sent" not in envs[0]
        _, _, _, _, info = env.step("ADD 1")  # shown "add 1", sent in the server's spelling
        assert info["action_valid"] and envs[0]["sent"] == ["add 1"]
        env.close()
    finally:
        server.should_exit = True


def test_served_envs_never_run_two_engine_calls_at_once():
    """TextWorld/ALFWorld are not thread-safe (concurrent sessions failed ~0.1% of steps
    with parser errors before): a server's env calls are serialised."""
    from gaca_envs.remote.service import ServeSettings, make_environment_class

    inside, overlaps = [0], [0]

    class Slow(gym.Env):
        observation_space = action_space = gym.spaces.Text(64)

        def reset(self, *, seed=None, options=None):
            return "start", {}

        def step(self, action):
            inside[0] += 1
            overlaps[0] += inside[0] > 1
            time.sleep(0.02)
            inside[0] -= 1
            return "x", 0.0, False, False, {}

    gym.register("test/Slow-v0", entry_point=Slow)
    env_cls, action_cls, *_ = make_environment_class(ServeSettings("test/Slow-v0"))
    assert env_cls.REQUIRES_SINGLE_THREAD_EXECUTOR
    sessions = [env_cls() for _ in range(4)]
    for s in sessions:
        s.reset(seed=0)
    threads = [threading.Thread(target=lambda s=s: [s.step(action_cls(action="a"))
                                                    for _ in range(5)]) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps[0] == 0
