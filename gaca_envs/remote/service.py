"""``gaca-env-serve``: any ``gaca/`` environment behind the OpenEnv protocol.

    gaca-env-serve gaca/ALFWorld-v0 split=valid_seen --port 8010
    gaca-env-serve gaca/Diag-Signs-v0 --host 0.0.0.0 --port 8010 --token "$TOKEN"

The protocol is OpenEnv's, served by the ``openenv`` package's own ``HTTPEnvServer``:

- ``/ws``: one WebSocket per session, one env per session. Messages
  ``{"type": "reset", "data": {"seed": 3, "options": {"task_id": 7}}}``,
  ``{"type": "step", "data": {"action": "go to desk 1"}}``, ``{"type": "state"}``,
  ``{"type": "close"}``; answers ``{"type": "observation", "data": {"observation": {...},
  "reward": r, "done": d}}`` or ``{"type": "error", "data": {"message": ...}}``. Closing
  the socket (or ``close``) closes the env; a session idle for ``--idle-timeout`` seconds
  is closed by the server; beyond ``--max-sessions`` a new session is refused with
  ``CAPACITY_REACHED``.
- ``/reset``, ``/step``, ``/state``: OpenEnv's stateless HTTP calls (a new env each
  call): fine for a look, not for an episode; play episodes over ``/ws``.
- ``/health``, ``/schema`` (action, observation and state JSON schemas), ``/metadata``,
  and ``/sessions`` (ours: active and maximum session counts, envs opened so far).

An observation carries the text, ``terminated``/``truncated``, every ``info`` key of the
local env under ``info`` and the contract keys at the top level (``admissible_actions``,
``state_key``, ``task``, ``task_id``, ``won``, ``action_valid``, ``score``); see
:mod:`gaca_envs.remote.wire`. Reset data: ``seed``, ``options`` (``{"task_id": k}``),
``expert`` (observations then carry ``expert_action``) and ``env_kwargs`` (only the keys
that ``--client-kwargs`` lets clients choose, ``split`` and ``anchor`` by default; other
keys must equal the server's). Unknown reset keys, a bad task id or split are errors naming the problem.

Security: binds 127.0.0.1 by default; any other address needs ``--token`` (or
``GACA_ENV_TOKEN``), and then every request must send ``Authorization: Bearer TOKEN``
(HTTP: 401 without it; WebSocket: the handshake is refused). Request bodies and WebSocket
messages are limited to ``--max-request-bytes`` (413). Errors are 4xx with a message and
no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from gaca_envs.net import bearer_ok
from gaca_envs.remote.wire import encode_step

DEFAULT_PORT = 8010
#: A request body not complete within this many seconds gets 408 (``--request-timeout``).
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServeSettings:
    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    client_kwargs: tuple[str, ...] = ("split", "anchor")
    """Env kwargs a client may choose per session (others are the server's)."""

    def kwargs_for(self, requested: dict[str, Any] | None) -> dict[str, Any]:
        """The env kwargs of a session that asked for ``requested`` (validated)."""
        requested = dict(requested or {})
        fixed = sorted(k for k, v in requested.items()
                       if k not in self.client_kwargs and self.env_kwargs.get(k, _MISSING) != v)
        if fixed:
            raise ValueError(f"env_kwargs {fixed} are fixed by this server "
                             f"({self.env_id} {self.env_kwargs}); clients may choose only "
                             f"{list(self.client_kwargs)} (gaca-env-serve --client-kwargs)")
        return {**self.env_kwargs, **requested}


_MISSING = object()


def _models():
    """The OpenEnv action/observation/state models (pydantic; imported when served)."""
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    class GacaAction(Action):
        action: str = Field(description="the action text, e.g. 'go to desk 1'")

    class GacaObservation(Observation):
        text: str = Field(default="", description="the observation text")
        terminated: bool = False
        truncated: bool = False
        admissible_actions: list[str] = Field(default_factory=list)
        state_key: str = Field(default="", description="canonical key of the true state")
        task: str = ""
        task_id: int | None = None
        won: bool = False
        action_valid: bool = True
        score: float | None = None
        info: dict[str, Any] = Field(default_factory=dict,
                                     description="every info key of the local env")
        expert_action: str | None = Field(default=None,
                                          description="with reset data expert=true")

    class GacaState(State):
        env_id: str = ""
        env_kwargs: dict[str, Any] = Field(default_factory=dict)
        num_tasks: int | None = None
        task_id: int | None = None
        state_key: str = ""

    return GacaAction, GacaObservation, GacaState


class _Session:
    """The methods of the OpenEnv ``Environment`` class that :func:`make_environment_class`
    makes (which sets ``settings``, ``engine_lock`` and the message types on it)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    # the engines are not thread-safe (TextWorld's parser and caches, ALFWorld's module
    # state: 16 concurrent ALFWorld sessions failed 15 of 13,223 steps unserialised), so
    # every env call of the process takes one lock, and sessions share one thread
    REQUIRES_SINGLE_THREAD_EXECUTOR = True
    opened = 0  # envs made since the server started (sessions and stateless calls)

    def __init__(self) -> None:
        super().__init__()
        type(self).opened += 1
        self._env = None
        self._kwargs: dict[str, Any] | None = None
        self._expert = False
        self._state = self.state_type(env_id=self.settings.env_id)

    def _ensure(self, env_kwargs: dict[str, Any] | None) -> None:
        import gymnasium as gym

        kwargs = self.settings.kwargs_for(env_kwargs)
        if self._env is None or kwargs != self._kwargs:
            self.close()
            with self.engine_lock:
                self._env = gym.make(self.settings.env_id, **kwargs)
            self._kwargs = kwargs
            self._state.env_kwargs = kwargs
            self._state.num_tasks = getattr(self._env.unwrapped, "num_tasks", None)

    def _observe(self, obs, reward, terminated, truncated, info):
        fields = encode_step(obs, reward, terminated, truncated, info)
        if self._expert and not fields["done"]:
            fn = getattr(self._env.unwrapped, "expert_action", None)
            fields["expert_action"] = fn() if fn else None
        self._state.state_key = fields["state_key"]
        self._state.task_id = fields["task_id"]
        return self.observation_type(**fields)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              options: dict[str, Any] | None = None,
              env_kwargs: dict[str, Any] | None = None, expert: bool = False,
              **unknown: Any):
        if unknown:
            raise ValueError(f"unknown reset field(s) {sorted(unknown)}; valid: seed, "
                             "episode_id, options, env_kwargs, expert")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or seed < 0):
            raise ValueError(f"seed must be a non-negative int or null, got {seed!r}")
        self._ensure(env_kwargs)
        self._expert = bool(expert)
        with self.engine_lock:
            try:
                obs, info = self._env.reset(seed=seed, options=options)
            except Exception:
                # a reset that raised can leave the env half set up: the next makes a new one
                env, self._env = self._env, None
                env.close()
                raise
            self._state.episode_id = episode_id
            self._state.step_count = 0
            return self._observe(obs, None, False, False, info)

    def step(self, action, timeout_s: float | None = None, **kwargs: Any):
        if self._env is None:
            raise RuntimeError("reset before step: no episode has started in this session")
        with self.engine_lock:
            obs, reward, terminated, truncated, info = self._env.step(action.action)
            self._state.step_count += 1
            return self._observe(obs, reward, terminated, truncated, info)

    @property
    def state(self):
        return self._state

    def get_metadata(self):
        from openenv.core.env_server.types import EnvironmentMetadata

        from gaca_envs import __version__

        return EnvironmentMetadata(
            name=self.settings.env_id, version=__version__,
            description=f"gaca environment {self.settings.env_id} "
                        f"(kwargs {json.dumps(self.settings.env_kwargs)}; clients may choose "
                        f"{list(self.settings.client_kwargs)})")

    def close(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            with self.engine_lock:
                env.close()


def make_environment_class(settings: ServeSettings):
    """An OpenEnv ``Environment`` class serving ``settings.env_id`` (one gym env each)."""
    import gymnasium as gym
    from openenv.core.env_server import Environment

    import gaca_envs

    gym.register_envs(gaca_envs)
    GacaAction, GacaObservation, GacaState = _models()
    env_class = type("GacaEnvironment", (_Session, Environment), {
        "settings": settings, "engine_lock": threading.Lock(), "opened": 0,
        "observation_type": GacaObservation, "state_type": GacaState})
    return env_class, GacaAction, GacaObservation, GacaState


class Guard:
    """ASGI middleware: bearer token (when set) and request size limit."""

    def __init__(self, app, token: str | None, max_body: int,
                 body_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.app, self.token, self.max_body = app, token, max_body
        self.body_timeout_s = body_timeout_s

    def _authorised(self, scope) -> bool:
        headers = dict(scope.get("headers") or [])
        return bearer_ok(headers.get(b"authorization", b"").decode("latin-1"), self.token)

    async def _refuse(self, send, status: int, message: str) -> None:
        body = json.dumps({"detail": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "websocket" and not self._authorised(scope):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        if kind != "http":
            return await self.app(scope, receive, send)
        if not self._authorised(scope):
            return await self._refuse(send, 401, "missing or wrong bearer token "
                                                 "(Authorization: Bearer TOKEN)")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body
            except ValueError:
                return await self._refuse(send, 400, "bad Content-Length")
            if too_big:
                return await self._refuse(send, 413, f"request body over {self.max_body} bytes")
        # read the whole body here (it is bounded): the limit then holds for bodies sent
        # without a Content-Length (chunked), which the app would report as unparsable
        chunks, seen = [], 0
        while True:
            try:  # a body that never arrives must not hold the request open
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except asyncio.TimeoutError:
                return await self._refuse(send, 408, "the request body did not arrive "
                                                     f"within {self.body_timeout_s:g} s")
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_body:
                return await self._refuse(send, 413, f"request body over {self.max_body} bytes")
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay, send)


def build_app(settings: ServeSettings, *, max_sessions: int = 64,
              idle_timeout_s: float | None = 600.0, token: str | None = None,
              max_request_bytes: int = 1 << 20,
              request_timeout_s: float = REQUEST_TIMEOUT_S):
    """The ASGI app: OpenEnv's routes for ``settings.env_id``, ``/sessions``, the guard."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig

    env_cls, action_cls, obs_cls, state_cls = make_environment_class(settings)
    app = FastAPI(title=f"gaca-env-serve {settings.env_id}", docs_url=None, redoc_url=None)
    server = HTTPEnvServer(env_cls, action_cls, obs_cls, env_name=settings.env_id,
                           state_cls=state_cls,
                           concurrency_config=ConcurrencyConfig(
                               max_concurrent_envs=max_sessions,
                               session_timeout=idle_timeout_s))
    server.register_routes(app, mode="simulation")

    @app.get("/sessions")
    async def sessions() -> dict[str, int]:
        return {"active": server.active_sessions, "max": server.max_concurrent_envs,
                "opened": env_cls.opened}

    async def client_error(request: Request, err: Exception):
        hint = (" (HTTP /step is stateless: OpenEnv makes a new env per call; play episodes "
                "over /ws)" if request.url.path.rstrip("/") == "/step" else "")
        return JSONResponse({"detail": f"{type(err).__name__}: {err}{hint}"}, status_code=400)

    async def server_error(request: Request, err: Exception):
        return JSONResponse({"detail": f"internal error ({type(err).__name__})"},
                            status_code=500)

    for kind in (ValueError, KeyError, RuntimeError, TypeError):
        app.add_exception_handler(kind, client_error)
    app.add_exception_handler(Exception, server_error)
    app.state.env_server = server
    return Guard(app, token, max_request_bytes, request_timeout_s)


def _parse_args(argv: list[str] | None):
    from gaca_envs.kv import parse_pairs

    p = argparse.ArgumentParser(prog="gaca-env-serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env_id", help="a registered gaca/ env id, e.g. gaca/ALFWorld-v0")
    p.add_argument("env_kwargs", nargs="*", help="key=value env kwargs (YAML values)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--token", default=os.environ.get("GACA_ENV_TOKEN"),
                   help="required off loopback (default: $GACA_ENV_TOKEN)")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds before an idle session is closed (0: never)")
    p.add_argument("--max-request-bytes", type=int, default=1 << 20)
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                   help="a request body not complete within S seconds gets 408")
    p.add_argument("--client-kwargs", default="split,anchor",
                   help="comma-separated env kwargs a client may choose per session")
    args = p.parse_args(argv)
    try:
        kwargs = parse_pairs(args.env_kwargs, "env kwarg")
    except ValueError as err:
        p.error(str(err))
    return p, args, kwargs


def main(argv: list[str] | None = None) -> int:
    from gaca_envs.net import is_loopback, port_in_use

    p, args, kwargs = _parse_args(argv)
    if not is_loopback(args.host) and not args.token:
        p.error(f"--host {args.host} is not a loopback address: set --token (or "
                "GACA_ENV_TOKEN) so that only your clients can use the server")
    if args.max_sessions < 1:
        p.error("--max-sessions must be >= 1")
    if not args.request_timeout > 0:
        p.error("--request-timeout must be > 0")
    settings = ServeSettings(args.env_id, kwargs,
                             tuple(k for k in args.client_kwargs.split(",") if k))
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    try:  # a wrong id, split or kwarg fails here, not in the first session
        gym.make(args.env_id, **kwargs).close()
    except Exception as err:  # noqa: BLE001 - reported as a usage error
        p.error(f"cannot make {args.env_id} {kwargs}: {type(err).__name__}: {err}")
    busy = port_in_use(args.host, args.port)
    if busy:
        p.error(f"cannot listen on {args.host}:{args.port}: {busy}")
    app = build_app(settings, max_sessions=args.max_sessions,
                    idle_timeout_s=args.idle_timeout or None, token=args.token,
                    max_request_bytes=args.max_request_bytes,
                    request_timeout_s=args.request_timeout)
    import uvicorn

    print(f"gaca-env-serve: {args.env_id} {kwargs} on http://{args.host}:{args.port} "
          f"(OpenEnv: /ws /reset /step /state /health /schema /metadata; /sessions)",
          file=sys.stderr, flush=True)
    # handed over by a factory: uvicorn calls the object it gets once, to detect a factory,
    # and an app whose __call__ is wrapped (a tracer, mutmut) answers that call
    uvicorn.run(lambda: app, factory=True, host=args.host, port=args.port,
                log_level="warning", ws_max_size=args.max_request_bytes, interface="asgi3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
