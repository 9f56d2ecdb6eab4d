"""gaca-env-serve's parts in process (its app on a thread, its guard as plain ASGI), the
wire format, the client's session handling and the collector's pool of env servers:
what a user of remote envs relies on without seeing it."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import gaca_envs
from conftest import free_port, has_module
from gaca_envs.remote.client import RemoteEnvLost, RemoteEnvRefused, ws_url
from gaca_envs.remote.wire import decode_step, encode_step, jsonable

gym.register_envs(gaca_envs)
pytestmark = pytest.mark.skipif(
    not (has_module("openenv") and has_module("uvicorn") and has_module("websockets")),
    reason="needs the envserver extra (pip install -e '.[envserver]')")
CORRIDOR = "gaca/Diag-Corridor-v0"


class InProcess:
    """gaca-env-serve's app on a uvicorn thread of this process."""

    def __init__(self, env_id=CORRIDOR, env_kwargs=None, **build):
        import uvicorn

        from gaca_envs.remote.service import ServeSettings, build_app

        self.settings = ServeSettings(env_id, dict(env_kwargs or {"split": "test"}))
        app = build_app(self.settings, **build)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(lambda: app, factory=True, host="127.0.0.1",
                                                    port=self.port, log_level="warning",
                                                    interface="asgi3"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path, token=None):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.url + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served():
    server = InProcess(max_sessions=3)
    yield server
    server.stop()


def test_the_wire_carries_a_step_exactly():
    info = {"admissible_actions": ("rest", "walk forward"), "state_key": "k", "task": "t",
            "task_id": np.int64(4), "won": np.bool_(True), "action_valid": False,
            "score": np.float32(0.5), "nested": {"a": (1, np.arange(2))}}
    fields = encode_step("obs", np.float64(1.0), True, False, info)
    assert json.loads(json.dumps(fields)) == fields  # plain JSON
    assert fields["admissible_actions"] == ["rest", "walk forward"] and fields["done"]
    assert (fields["task_id"], fields["won"], fields["action_valid"], fields["score"]) == \
        (4, True, False, 0.5)
    assert fields["info"]["nested"] == {"a": [1, [0, 1]]} and fields["reward"] == 1.0
    obs, reward, terminated, truncated, back = decode_step({"observation": fields,
                                                            "reward": 1.0, "done": True})
    assert (obs, reward, terminated, truncated) == ("obs", 1.0, True, False)
    assert back["admissible_actions"] == ("rest", "walk forward")  # a tuple again
    reset = encode_step("start", None, False, True, {})
    assert reset["reward"] is None and reset["done"] and reset["action_valid"]
    assert reset["won"] is False and reset["state_key"] == "" and reset["task_id"] is None
    assert decode_step({"observation": reset})[1:4] == (0.0, False, True)
    # the reward inside the observation (no outer one), a bare and a flat observation
    assert decode_step({"observation": {**fields, "reward": 2.0}})[1] == 2.0
    assert decode_step({"observation": {"text": "x"}}) == ("x", 0.0, False, False, {})
    assert decode_step({"text": "flat", "reward": 0.5}) == ("flat", 0.5, False, False, {})
    with pytest.raises(ValueError, match="non-finite"):
        jsonable({"x": float("nan")})
    with pytest.raises(TypeError, match="set"):
        jsonable({1, 2})


class FakeSocket:
    """A session's websocket: answers in order (an exception: the connection broke)."""

    def __init__(self, *answers):
        self.answers, self.sent = list(answers), []

    def send(self, text):
        self.sent.append(json.loads(text))

    def recv(self, timeout=None):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return json.dumps(answer)


def test_the_client_reads_answers_in_both_forms_and_says_goodbye():
    from gaca_envs.remote.client import RemoteEnv, RemoteEnvLost, RemoteEnvRefused

    env = RemoteEnv("http://127.0.0.1:1", expert=True, render_mode="ansi")
    env._ws = FakeSocket({"type": "observation", "data": {"text": "flat", "reward": 1.0,
                                                            "expert_action": "go"}},
                         {"type": "state"},
                         {"type": "error"},
                         TimeoutError("silence"), {"type": "observation", "data": {}})
    assert env.step("look")[:2] == ("flat", 1.0)  # a flat observation, not nested
    assert env.render() == "flat" and env.expert_action() == "go"
    assert env.state() == {}  # an answer without data
    with pytest.raises(RemoteEnvRefused, match="'type': 'error'"):  # no message: the answer
        env.state()
    with pytest.raises(RemoteEnvLost, match="lost: TimeoutError: silence"):
        env.state()  # what came after the break is no error message: the session is lost
    assert env._ws is None
    env._ws = FakeSocket(TimeoutError("silence"), [1, 2])  # last words that are no message
    with pytest.raises(RemoteEnvLost):
        env.state()
    env._ws = socket = FakeSocket()
    env.close()
    assert socket.sent == [{"type": "close"}] and env._ws is None


def test_client_urls_and_fixed_kwargs():
    from gaca_envs.remote.service import ServeSettings

    assert ws_url("http://h:1/") == "ws://h:1/ws" and ws_url("https://h") == "wss://h/ws"
    assert ws_url("ws://h/ws") == "ws://h/ws" and ws_url("wss://h") == "wss://h/ws"
    with pytest.raises(ValueError, match="must start with"):
        ws_url("h:1")
    s = ServeSettings(CORRIDOR, {"split": "test", "world": "x"})
    assert s.kwargs_for({"split": "train", "anchor": "observation"}) == \
        {"split": "train", "world": "x", "anchor": "observation"}
    assert s.kwargs_for({"world": "x"}) == {"split": "test", "world": "x"}  # equal: allowed
    with pytest.raises(ValueError, match=r"\['level', 'world'\] are fixed"):
        s.kwargs_for({"world": "y", "level": 2})
    assert s.kwargs_for(None) == {"split": "test", "world": "x"}


def test_a_remote_episode_equals_the_local_one(served):
    local = gym.make(CORRIDOR, split="test")
    remote = gym.make("gaca/Remote-v0", url=served.url, expert=True)
    try:
        a = local.reset(seed=3, options={"task_id": 2})
        b = remote.reset(seed=3, options={"task_id": 2})
        assert a == b
        assert remote.unwrapped.expert_action() == local.unwrapped.expert_action()
        state = remote.unwrapped.state()
        assert (state["task_id"], state["step_count"], state["num_tasks"]) == (2, 0, 16)
        assert state["state_key"] == a[1]["state_key"]
        for _ in range(40):
            action = local.unwrapped.expert_action() or "rest"
            a, b = local.step(action), remote.step(action)
            assert a == b
            if a[2] or a[3]:
                break
        assert a[2] and a[4]["won"] and remote.unwrapped.expert_action() is None
        assert remote.unwrapped.state()["step_count"] > 0
        assert remote.unwrapped.num_tasks == 16
        assert remote.unwrapped.render() is None
    finally:
        remote.close()
        local.close()
    plain = gym.make("gaca/Remote-v0", url=served.url, render_mode="ansi")
    obs, _ = plain.reset(seed=0)
    assert plain.unwrapped.render() == obs
    with pytest.raises(RuntimeError, match="expert=True"):
        plain.unwrapped.expert_action()
    # not asked for, the server does not compute the expert's action
    sent = plain.unwrapped._call({"type": "step", "data": {"action": "rest"}})
    assert sent["observation"].get("expert_action") is None
    # resting until the step limit: truncated there, as the local env is
    local = gym.make(CORRIDOR, split="test")
    try:
        assert local.reset(seed=1) == plain.reset(seed=1)
        for _ in range(100):
            a, b = local.step("rest"), plain.step("rest")
            assert a == b
            if a[2] or a[3]:
                break
        assert a[3] and not a[2]
    finally:
        local.close()
        plain.close()


def test_session_errors_name_the_problem_and_the_session_goes_on(served):
    env = gym.make("gaca/Remote-v0", url=served.url)
    try:
        with pytest.raises(RemoteEnvRefused, match="reset before step"):
            env.unwrapped.step("rest")  # past gymnasium's own check: the server's
        for seed in (-1, True, "3"):  # what another client could send
            with pytest.raises(RemoteEnvRefused, match="seed must be a non-negative int"):
                env.unwrapped._call({"type": "reset", "data": {"seed": seed}})
        with pytest.raises(RemoteEnvRefused, match=r"unknown reset field\(s\) \['level'\]"):
            env.unwrapped._call({"type": "reset", "data": {"seed": 1, "level": 2}})
        with pytest.raises(ValueError, match="task_id"):  # refused is a ValueError too
            env.reset(seed=1, options={"task_id": 99})
        obs, info = env.reset(seed=1, options={"task_id": 3})
        assert info["task_id"] == 3
        step = env.step(info["admissible_actions"][0])  # the episode after a failed reset
        assert step[4]["action_valid"] is True
    finally:
        env.close()
    train = gym.make("gaca/Remote-v0", url=served.url, env_kwargs={"split": "train"},
                     anchor="observation")
    try:
        train.reset(seed=0)
        state = train.unwrapped.state()
        assert state["env_kwargs"] == {"split": "train", "anchor": "observation"}
        assert state["num_tasks"] == 48  # a session's own kwargs made its own env
    finally:
        train.close()


def test_sessions_are_counted_bounded_and_freed(served):
    envs = [gym.make("gaca/Remote-v0", url=served.url) for _ in range(4)]
    try:
        for e in envs[:3]:
            e.reset(seed=0)
        assert served.get("/sessions")[1]["active"] == 3
        assert served.get("/sessions")[1]["max"] == 3
        with pytest.raises(RemoteEnvRefused, match="CAPACITY_REACHED"):
            envs[3].reset(seed=0)
        envs[0].close()
        deadline = time.time() + 10
        while served.get("/sessions")[1]["active"] != 2 and time.time() < deadline:
            time.sleep(0.05)
        envs[3].reset(seed=0)  # a new session after the refusal
    finally:
        for e in envs:
            e.close()
    assert served.get("/metadata")[1]["name"] == CORRIDOR


def test_metadata_and_schema_describe_the_served_env():
    """What a client reads of the env and its fields (a server of its own: mutmut counts
    a module fixture's calls to the first test that uses it)."""
    server = InProcess(env_kwargs={"split": "train"})
    try:
        metadata = server.get("/metadata")[1]
        assert metadata["name"] == CORRIDOR
        assert 'kwargs {"split": "train"}; clients may choose' in metadata["description"]
        schema = server.get("/schema")[1]
        assert schema["action"]["properties"]["action"]["description"].startswith(
            "the action text")
        assert schema["observation"]["properties"]["info"]["description"] == \
            "every info key of the local env"
    finally:
        server.stop()


def test_a_lost_server_is_a_lost_session_and_the_next_reset_reconnects():
    server = InProcess()
    env = gym.make("gaca/Remote-v0", url=server.url, timeout_s=5)
    env.reset(seed=0)
    server.stop()
    with pytest.raises(RemoteEnvLost):
        env.step("rest")
    with pytest.raises(RemoteEnvLost, match="cannot open a session"):
        env.reset(seed=0)
    again = InProcess()
    try:
        env.unwrapped.url = ws_url(again.url)
        assert env.reset(seed=0, options={"task_id": 5})[1]["task_id"] == 5
    finally:
        env.close()
        again.stop()


# ------------------------------------------------------------------ the guard, as ASGI
def guard_call(token=None, max_body=10, headers=(), body_parts=(b"",), kind="http",
               timeout_s=5.0):
    """Run the guard once over a recording app; (what was sent, what the app saw)."""
    from gaca_envs.remote.service import Guard

    seen, sent = [], []

    async def app(scope, receive, send):
        message = await receive()
        seen.append(message)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    parts = [{"type": "http.request", **({} if p is None else {"body": p}),
              "more_body": i < len(body_parts) - 1} for i, p in enumerate(body_parts)]

    async def receive():
        if kind == "websocket":
            return {"type": "websocket.connect"}
        if not parts:
            await asyncio.sleep(3600)
        return parts.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(Guard(app, token, max_body, timeout_s)(scope, receive, send))
    return sent, seen


def status_of(sent):
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), None)


def test_the_guard_checks_token_size_and_timely_bodies():
    assert status_of(guard_call(token="t")[0]) == 401
    sent, seen = guard_call(token="t", headers=[("authorization", "Bearer t")],
                            body_parts=(b"12345", b"67890"))
    assert status_of(sent) == 200 and seen[0]["body"] == b"1234567890"  # replayed whole
    assert not seen[0]["more_body"]
    assert status_of(guard_call(headers=[("content-length", "11")])[0]) == 413
    assert status_of(guard_call(headers=[("content-length", "ten")])[0]) == 400
    sent, seen = guard_call(body_parts=(b"123456", b"78901"))  # chunked, 11 bytes
    assert status_of(sent) == 413 and not seen
    sent, _ = guard_call(headers=[("content-length", "10")], body_parts=(b"1234567890",))
    assert status_of(sent) == 200  # exactly the limit
    sent, seen = guard_call(body_parts=(None,))  # ASGI: a message without a body has none
    assert status_of(sent) == 200 and seen[0]["body"] == b""
    sent, seen = guard_call(body_parts=(), timeout_s=0.2)  # a body that never comes
    assert status_of(sent) == 408 and not seen
    refused = json.loads(sent[-1]["body"])["detail"]
    assert "did not arrive within 0.2 s" in refused
    start, body = sent[-2:]  # a whole HTTP answer: its length, then its body
    assert (start["type"], body["type"]) == ("http.response.start", "http.response.body")
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    ws, _ = guard_call(token="t", kind="websocket")
    assert ws == [{"type": "websocket.close", "code": 1008}]


def test_serve_refuses_bad_settings_before_listening(capsys):
    from gaca_envs.remote.service import main

    cases = [(["gaca/Diag-Signs-v0", "--host", "0.0.0.0"], "not a loopback address"),
             (["gaca/Diag-Signs-v0", "--max-sessions", "0"], "--max-sessions must be >= 1"),
             (["gaca/Diag-Signs-v0", "--request-timeout", "0"], "--request-timeout must be"),
             (["gaca/Diag-Signs-v0", "split=nope"], "cannot make gaca/Diag-Signs-v0"),
             (["gaca/Diag-Signs-v0", "split"], "key=value")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv
    busy = InProcess()
    try:
        with pytest.raises(SystemExit):
            main(["gaca/Diag-Signs-v0", "--port", str(busy.port)])
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        busy.stop()


def test_serve_hands_uvicorn_the_app_its_flags_describe(monkeypatch, capsys):
    """What gaca-env-serve starts (uvicorn stood in): the app its flags describe, handed
    over by a factory, the ASGI3 interface, the websocket size limit as a number; the
    address it serves on, on stderr."""
    import uvicorn

    from gaca_envs.remote.service import Guard, main

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append((app, kw)))
    port = free_port()
    assert main(["gaca/Diag-Signs-v0", "split=test", "--port", str(port), "--max-sessions",
                 "2", "--idle-timeout", "30", "--max-request-bytes", "2048",
                 "--request-timeout", "0.5", "--token", "s3cret"]) == 0
    (factory, kw), = started
    assert kw == {"factory": True, "host": "127.0.0.1", "port": port, "log_level": "warning",
                  "ws_max_size": 2048, "interface": "asgi3"}
    app = factory()
    assert isinstance(app, Guard) and factory() is app
    assert (app.token, app.max_body, app.body_timeout_s) == ("s3cret", 2048, 0.5)
    server = app.app.state.env_server
    assert server.env_name == "gaca/Diag-Signs-v0"
    assert (server._concurrency_config.max_concurrent_envs,
            server._concurrency_config.session_timeout) == (2, 30.0)
    err = capsys.readouterr().err
    assert f"gaca-env-serve: gaca/Diag-Signs-v0 {{'split': 'test'}} on http://127.0.0.1:{port}" \
        in err


# ------------------------------------------------------------------ the collector's pool
def test_the_pool_checks_its_servers_and_brings_a_lost_one_back():
    from gaca_agent.collect import remote_pool
    from gaca_agent.collect.remote_pool import RemotePool
    from gaca_agent.collect.workers import WorkerFailure

    a, b = InProcess(), InProcess()
    with pytest.raises(ValueError, match=f"serves '{CORRIDOR}', not 'gaca/Diag-Signs-v0'"):
        RemotePool([a.url], "gaca/Diag-Signs-v0")
    with pytest.raises(RuntimeError, match="cannot be reached"):
        RemotePool([f"http://127.0.0.1:{free_port()}"], CORRIDOR)
    with pytest.raises(ValueError, match="at least one URL"):
        RemotePool([], CORRIDOR)
    pool = RemotePool([a.url + "/", b.url], CORRIDOR, {"split": "test"}, num_envs=4,
                      timeout_s=5)
    try:
        assert [pool.worker_of(s) for s in range(4)] == [0, 1, 0, 1] and pool.pids() == []
        resets = pool.call("reset", [(s, (s, {"task_id": s})) for s in range(4)])
        assert [resets[s][1]["task_id"] for s in range(4)] == [0, 1, 2, 3]
        assert a.get("/sessions")[1]["active"] == 2 and b.get("/sessions")[1]["active"] == 2
        dance = pool.call("dance", [(0, None)])[0]
        assert dance.message == "ValueError: unknown env command 'dance'"
        b.stop()
        out = pool.call("step", [(0, "rest"), (1, "rest")])
        assert isinstance(out[1], WorkerFailure) and b.url in out[1].message
        assert out[0][1] == 0.0  # the other server plays on
        assert pool.restarts == 1 and pool.draining(1) and pool.draining(3)
        assert not pool.draining(0)
        b2 = InProcess(max_sessions=8)
        pool.servers[1] = b2.url
        pool._retry_at[1] = time.monotonic()  # its back-off has passed
        assert pool.recycle_idle({0}) == 1 and not pool.draining(1)
        assert pool.call("reset", [(1, (0, {"task_id": 7}))])[1][1]["task_id"] == 7
        b2.stop()
        pool.call("step", [(1, "rest")])
        assert pool._failures == {1: 1} and pool.restarts == 2
        pool._retry_at[1] = time.monotonic()
        assert pool.recycle_idle(set()) == 0  # still down: retried later
        assert pool._failures == {1: 2}
        assert pool._retry_at[1] - time.monotonic() > remote_pool.BACKOFF_S[0]
        for _ in range(10):  # the back-off doubles up to a minute, and stays there
            pool._schedule_retry(1)
        assert pool._retry_at[1] - time.monotonic() == pytest.approx(60.0, abs=1.0)
    finally:
        pool.close()
        a.stop()


def test_the_pool_sends_its_token_and_counts_every_server_back():
    from gaca_agent.collect.remote_pool import RemotePool

    servers = [InProcess(token="t0k") for _ in range(2)]
    try:
        with pytest.raises(RuntimeError, match="cannot be reached"):
            RemotePool([servers[0].url], CORRIDOR)  # no token: 401 at the check
        pool = RemotePool([s.url for s in servers], CORRIDOR, {"split": "test"}, num_envs=2,
                          token="t0k")
        try:
            assert (pool.num_envs, pool.expert, pool.timeout_s) == (2, False, 600.0)
            out = pool.call("reset", [(0, (0, {"task_id": 1})), (1, (0, {"task_id": 2}))])
            assert out[0][1]["task_id"] == 1 and out[1][1]["task_id"] == 2
            pool._down_since = {0: time.monotonic(), 1: time.monotonic()}
            pool._retry_at = {0: 0.0, 1: 0.0}
            assert pool.recycle_idle({0, 1}) == 2  # both healthy again, counted
        finally:
            pool.close()
    finally:
        for s in servers:
            s.stop()


def test_the_pool_plays_what_the_env_section_asks_for():
    from gaca_agent.collect.pools import make_pool
    from gaca_agent.config import EnvSection

    server = InProcess(token="k")
    local = gym.make(CORRIDOR, split="train")
    try:
        env = EnvSection(id=CORRIDOR, kwargs={"split": "train"}, max_live_envs=2,
                         servers=(server.url,), timeout_s=7)
        pool = make_pool(env.spec, env.hosts, token="k")
        try:
            assert (pool.env_id, pool.env_kwargs, pool.timeout_s, pool.token) == \
                (CORRIDOR, {"split": "train"}, 7, "k")
            assert (pool.restarts, pool.recycles, pool.expert) == (0, 0, False)
            pool.expert = True
            obs, info = pool.call("reset", [(0, (5, None))])[0]  # the task drawn by seed 5
            lobs, linfo = local.reset(seed=5)
            assert (obs, info["task_id"], info["state_key"]) == \
                (lobs, linfo["task_id"], linfo["state_key"])
            assert pool._envs[0].unwrapped.state()["num_tasks"] == 48  # the train split
            expert = pool.call("expert", [(0, None)])[0]
            assert expert == local.unwrapped.expert_action() and expert
            stepped = pool.call("step", [(0, expert)])[0]
            assert stepped[4]["action_valid"] and stepped[:4] == local.step(expert)[:4]
        finally:
            pool.close()
    finally:
        server.stop()
        local.close()


def test_a_health_check_of_a_silent_server_is_bounded():
    import socket

    from gaca_agent.collect.remote_pool import RemotePool

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    a = InProcess()
    pool = RemotePool([a.url], CORRIDOR, {"split": "test"})
    try:
        pool.servers[0] = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        assert pool._healthy(0) is False
        assert time.monotonic() - t0 < 15  # the 5 s bound, not for ever
    finally:
        pool.close()
        a.stop()
        listener.close()


def test_the_pool_stops_when_every_server_stays_down(monkeypatch):
    from gaca_agent.collect import remote_pool
    from gaca_agent.collect.remote_pool import RemotePool

    monkeypatch.setattr(remote_pool, "BACKOFF_S", (0.05,))
    a = InProcess()
    pool = RemotePool([a.url], CORRIDOR, {"split": "test"}, num_envs=1, timeout_s=0.3)
    try:
        pool.call("reset", [(0, (0, None))])
        a.stop()
        pool.call("step", [(0, "rest")])
        assert pool.draining(0)
        t0 = time.monotonic()
        assert pool.recycle_idle({0}) == 0 and time.monotonic() - t0 < 0.05  # busy: no wait
        assert pool.recycle_idle(set()) == 0  # down, not yet for timeout_s: wait and retry
        assert time.monotonic() - t0 < 0.5  # the wait ends at the next retry (0.05 s)
        with pytest.raises(RuntimeError, match="every env server has been down for over"):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                pool.recycle_idle(set())
    finally:
        pool.close()


def test_stateless_http_calls_answer_errors_as_400s_with_the_reason(served):
    """OpenEnv's HTTP /reset and /step (a new env per call): a bad task is a 400 naming the
    error, /step says to play episodes over /ws, and neither carries a traceback."""
    import urllib.error
    import urllib.request

    def post(path, body):
        request = urllib.request.Request(served.url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, body = post("/reset", {"seed": 1, "options": {"task_id": 99}})
    assert status == 400 and body["detail"].startswith("ValueError: task_id")
    assert "/ws" not in body["detail"]
    status, body = post("/step", {"action": {"action": "rest"}})
    assert status == 400 and body["detail"].endswith("play episodes over /ws)")
    assert "Traceback" not in body["detail"]
    status, body = post("/reset", {"seed": 1})
    assert status == 200 and body["observation"]["state_key"]
