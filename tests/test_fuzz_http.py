"""HTTP fuzzing: hypothesis-made requests (methods, paths, headers, bodies of every JSON
shape and type, encodings, lying or missing lengths, chunked bodies) against gaca-serve,
gaca-env-serve and gaca-webshop-serve. Each answer must come within the request timeout,
never be a 5xx (503, busy, excepted) or carry a traceback, need the token on every route
where one is set, and a refused request must leave the server's state as it was.

``GACA_FUZZ_EXAMPLES=N`` (default 100 per server) runs more."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import has_module, start_env_server, stop_env_server  # noqa: E402

EXAMPLES = int(os.environ.get("GACA_FUZZ_EXAMPLES", "100"))
TIMEOUT_S = 1.0  # every server's request timeout here
TOKEN = "fuzz-token"
AUTHORISED = {"Host": "127.0.0.1", "Authorization": f"Bearer {TOKEN}"}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

# ------------------------------------------------------------------ requests
SCALARS = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=16))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10)
HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=24)
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]) \
    | st.from_regex(r"[A-Z]{1,9}", fullmatch=True)
SEGMENT = st.text(st.sampled_from("abcXYZ019-_.~%"), max_size=8)


def mutated(base: dict):
    """``base`` with fields replaced by any JSON, dropped, or added."""
    def build(draw_changes):
        body = dict(base)
        for key, value in draw_changes:
            if value is _DROP:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    keys = st.sampled_from(sorted(base) + ["extra", ""])
    change = st.tuples(keys, JSON | st.just(_DROP))
    return st.lists(change, max_size=3).map(build)


_DROP = object()


@st.composite
def requests(draw, routes, bodies):
    """(method, path, headers, body bytes, framing): mostly a route's own method with the
    token, so that the requests reach the code behind the routes."""
    method, path = draw(st.sampled_from(routes))
    if draw(st.integers(0, 3)) == 0:
        method = draw(METHODS)
    if draw(st.integers(0, 4)) == 0:
        path = path.rstrip("/") + "/" + draw(SEGMENT)
    if draw(st.integers(0, 4)) == 0:
        path += "?" + draw(st.sampled_from(["", "a=1", "action=click%5Bx%5D", "x=%ff&y"]))
    value = draw(bodies)
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "latin-1"]))
    if isinstance(value, bytes):
        raw = value
    else:
        text = json.dumps(value) if not isinstance(value, str) else value
        raw = text.encode(encoding, "replace")
    headers = {"Host": "127.0.0.1"}
    kind = draw(st.sampled_from(["application/json", "application/json; charset=utf-16",
                                 "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=zz", None]))
    if kind:
        headers["Content-Type"] = kind
    auth = draw(st.sampled_from([f"Bearer {TOKEN}"] * 5 + ["Bearer wrong", "Bearer",
                                                         "Basic Zm9vOmJhcg==", None]))
    if auth:
        headers["Authorization"] = auth
    for name, text in draw(st.dictionaries(st.from_regex(r"X-[A-Za-z]{1,6}", fullmatch=True),
                                           HEADER_TEXT, max_size=2)).items():
        headers[name] = text
    framing = draw(st.sampled_from(["exact", "exact", "exact", "none", "short", "chunked",
                                    "bad"]))
    return method, path, headers, raw, framing


def send(port: int, method: str, path: str, headers: dict, body: bytes, framing: str):
    """One request on a fresh connection: (status, body text, seconds)."""
    head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()),
            "Connection: close"]
    payload = body
    if framing == "exact":
        head.append(f"Content-Length: {len(body)}")
    elif framing == "short":  # announces more than it sends: the server must time out
        head.append(f"Content-Length: {len(body) + 10}")
    elif framing == "bad":
        head.append("Content-Length: ten")
    elif framing == "chunked":
        head.append("Transfer-Encoding: chunked")
        payload = (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n") if body else \
            b"0\r\n\r\n"
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S + 20) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may refuse before it has read everything
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        except socket.timeout:
            pytest.fail(f"no answer within {TIMEOUT_S + 20:g} s: {method} {path} {framing}")
    seconds = time.monotonic() - start
    reply = b"".join(chunks)
    status_line = reply.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return status, reply.decode("utf-8", "replace"), seconds


STANDARD = {"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"}


def check_answer(status, reply, seconds, request, needs_token=True):
    method, path, headers, _, framing = request
    where = f"{method} {path} ({framing}, {headers.get('Content-Type')})"
    assert seconds < TIMEOUT_S + 5, f"{where}: answered after {seconds:.1f} s"
    assert "Traceback" not in reply and 'File "' not in reply, f"{where}: {reply[:500]}"
    broken = framing in ("short", "bad", "chunked") or method not in STANDARD
    if status is None:  # closed without an answer: only a request the HTTP layer cannot read
        assert broken, where
        return
    assert status < 500 or status in (501, 503), f"{where}: {reply[:800]}"
    if needs_token and headers.get("Authorization") != f"Bearer {TOKEN}":
        # refused for the token, or by the HTTP layer before any route could run
        assert status == 401 or (broken and status in (400, 405, 411, 501)), \
            f"{where}: {status} without the token: {reply[:300]}"


def fuzz_once(port, request, state, needs_token=True):
    """Send ``request``; check the answer; a refused one must leave ``state(port)``."""
    before = state(port)
    status, reply, seconds = send(port, *request)
    check_answer(status, reply, seconds, request, needs_token)
    if status is None or status >= 400:
        assert state(port) == before, request


# ------------------------------------------------------------------ gaca-serve
@pytest.fixture(scope="module")
def chat_server(tiny_model_path):
    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=4)
    server = make_server(model, "127.0.0.1", 0, TOKEN, request_timeout_s=TIMEOUT_S)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()
    model.close()


def chat_state(port):
    out = {}
    for path in ("/v1/models", "/is_paused", "/get_weight_version"):
        status, reply, _ = send(port, "GET", path, AUTHORISED, b"", "exact")
        out[path] = (status, json.loads(reply.split("\r\n\r\n", 1)[1] or "null"))
        for model in (out[path][1] or {}).get("data", []) if path == "/v1/models" else []:
            model.pop("created", None)
    return out


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
CHAT_PATHS = [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
              ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions"),
              ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
              ("POST", "/load_lora_adapter"), ("POST", "/unload_lora_adapter"),
              ("GET", "/is_paused"), ("POST", "/collective_rpc"),
              ("POST", "/update_weight_version"), ("GET", "/weight_info"),
              ("GET", "/get_weight_version"), ("POST", "/update_weights_from_disk"),
              ("GET", "/"), ("POST", "/v1")]
CHAT_BODIES = (mutated(CHAT).filter(lambda b: not isinstance(b.get("max_tokens"), int)
                                    or b["max_tokens"] <= 4)
               | mutated({"lora_name": "a", "lora_path": "/nonexistent"})
               | mutated({"model_path": "/nonexistent", "weight_version": "v"})
               | JSON | st.binary(max_size=64))


@FUZZ
@given(request=requests(CHAT_PATHS, CHAT_BODIES))
def test_gaca_serve_survives_any_request(chat_server, request):
    fuzz_once(chat_server, request, chat_state)


# ------------------------------------------------------------------ gaca-env-serve
@pytest.fixture(scope="module")
def env_server():
    if not (has_module("openenv") and has_module("uvicorn")):
        pytest.skip("env server needs the envserver extra (pip install -e '.[envserver]')")
    proc, url = start_env_server("gaca/Diag-Corridor-v0", "split=test", "--token", TOKEN,
                                 "--request-timeout", str(TIMEOUT_S),
                                 "--max-request-bytes", "4096")
    yield int(url.rsplit(":", 1)[1])
    stop_env_server(proc)


def env_state(port):
    status, reply, _ = send(port, "GET", "/sessions", AUTHORISED, b"", "exact")
    return status, json.loads(reply.split("\r\n\r\n", 1)[1])["active"]


ENV_PATHS = [("GET", "/health"), ("POST", "/reset"), ("POST", "/reset"), ("POST", "/step"),
             ("POST", "/step"), ("GET", "/state"), ("GET", "/schema"), ("GET", "/metadata"),
             ("GET", "/sessions"), ("GET", "/ws"), ("GET", "/"), ("GET", "/docs"),
             ("POST", "/mcp")]
ENV_BODIES = (mutated({"seed": 1, "env_kwargs": {"split": "test"}, "expert": True})
              | mutated({"action": {"action": "walk forward"}, "timeout_s": 1})
              | JSON | st.binary(max_size=64) | st.just("x" * 5000))


@FUZZ
@given(request=requests(ENV_PATHS, ENV_BODIES))
def test_gaca_env_serve_survives_any_request(env_server, request):
    fuzz_once(env_server, request, env_state)


# ------------------------------------------------------------------ gaca-webshop-serve
@pytest.fixture(scope="module")
def shop_server():
    pytest.importorskip("flask")
    from gaca_envs.webshop import website
    from gaca_envs.webshop.world import WorldConfig, load_world

    world = load_world(WorldConfig(num_products=200))
    server = website.BackgroundServer(website.create_app(world), request_timeout_s=TIMEOUT_S)
    send(server.port, "GET", "/start/fz/0", {"Host": "127.0.0.1"}, b"", "exact")
    yield server.port
    server.close()


def shop_state(port):
    status, reply, _ = send(port, "GET", "/state/fz", {"Host": "127.0.0.1"}, b"", "exact")
    return status, reply.split("\r\n\r\n", 1)[1]


SHOP_PATHS = [("GET", "/"), ("GET", "/start/fz/0"), ("GET", "/start/fz/99999"),
              ("GET", "/start/bad%20id/0"), ("GET", "/s/fz"), ("POST", "/act/fz"),
              ("POST", "/act/fz"), ("GET", "/act/fz"), ("POST", "/act/nobody"),
              ("GET", "/state/fz"), ("GET", "/state/nobody"), ("GET", "/favicon.ico")]
SHOP_BODIES = (st.just(b"action=click%5Bnext+%3E%5D") | st.just(b"search_query=red+shirt")
               | st.text(max_size=40).map(lambda t: "action=" + t) | JSON
               | st.binary(max_size=64))


@FUZZ
@given(request=requests(SHOP_PATHS, SHOP_BODIES))
def test_gaca_webshop_serve_survives_any_request(shop_server, request):
    fuzz_once(shop_server, request, shop_state, needs_token=False)


# ------------------------------------------------------------------ every route, every framing
SERVERS = {"gaca-serve": ("chat_server", CHAT_PATHS, json.dumps(CHAT).encode(), True),
           "gaca-env-serve": ("env_server", ENV_PATHS, b'{"seed": 1}', True),
           "gaca-webshop-serve": ("shop_server", SHOP_PATHS, b"action=click%5Bnext+%3E%5D",
                                  False)}


@pytest.mark.parametrize("name", ["gaca-serve", "gaca-env-serve"])
def test_every_route_needs_the_token(request, name):
    fixture, routes, body, _ = SERVERS[name]
    port = request.getfixturevalue(fixture)
    for method, path in sorted(set(routes)):
        for auth in (None, "Bearer wrong", f"Bearer {TOKEN}x", "Basic Zm9vOmJhcg=="):
            headers = {"Host": "127.0.0.1", "Content-Type": "application/json"}
            if auth:
                headers["Authorization"] = auth
            status, reply, _ = send(port, method, path, headers, body, "exact")
            assert status == 401, (method, path, auth, reply[:300])


@pytest.mark.parametrize("name", sorted(SERVERS))
@pytest.mark.parametrize("framing", ["short", "bad", "chunked", "none"])
def test_lying_lengths_and_chunked_bodies_are_answered_in_time(request, name, framing):
    """A body shorter than its Content-Length waits for the request timeout (408 or a
    closed connection), never for ever; a bad length, a chunked body or none at all gets
    an answer too, and the server serves the next request."""
    fixture, routes, body, token = SERVERS[name]
    port = request.getfixturevalue(fixture)
    headers = {"Host": "127.0.0.1", "Content-Type": "application/json"
               if body.startswith(b"{") else "application/x-www-form-urlencoded"}
    if token:
        headers["Authorization"] = f"Bearer {TOKEN}"
    for method, path in sorted({r for r in routes if r[0] == "POST"}):
        call = (method, path, headers, body, framing)
        status, reply, seconds = send(port, *call)
        check_answer(status, reply, seconds, call, needs_token=token)
        if framing == "short":
            assert status in (None, 400, 404, 408), (path, reply[:300])
        if framing == "chunked" and name == "gaca-serve":  # it reads Content-Length only
            assert status in (404, 411), (path, reply[:300])
    ok = send(port, "GET", routes[0][1], headers, b"", "exact")
    assert ok[0] == 200, ok[1][:300]
