"""``gaca/Remote-v0``: a gymnasium env backed by a ``gaca-env-serve`` (or any OpenEnv
server whose observations carry a ``text`` field).

    env = gym.make("gaca/Remote-v0", url="http://127.0.0.1:8010",
                   env_kwargs={"split": "valid_unseen"})

Same contract as the local env: ``reset(seed=, options={"task_id": k})`` and ``step(text)``
return the served env's observation, reward, ``terminated``/``truncated`` and ``info``
exactly (the time limit is the server env's, so this wrapper adds none). One WebSocket
session per env (opened on the first reset, closed by :meth:`close`). ``expert=True``
asks the server for the expert's action with every observation
(``env.unwrapped.expert_action()``). ``anchor=`` is passed on to the served env like
``env_kwargs``. An error answer raises :class:`RemoteEnvRefused` with the server's message
(a ``ValueError``, as the local env raises); a lost connection raises
:class:`RemoteEnvLost`, and the next reset opens a new session.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import gymnasium as gym

from gaca_envs.core import text_spaces
from gaca_envs.remote.wire import decode_step


class RemoteEnvError(RuntimeError):
    """A remote env call failed."""


class RemoteEnvLost(RemoteEnvError):
    """The server could not be reached, or the session's connection broke or timed out."""


class RemoteEnvRefused(RemoteEnvError, ValueError):
    """The server answered with an error (a bad task id, unknown option, full server ...);
    a ``ValueError`` like the local env's."""


def ws_url(url: str) -> str:
    base = url.rstrip("/")
    if base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    elif base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif not base.startswith(("ws://", "wss://")):
        raise ValueError(f"url must start with http://, https://, ws:// or wss://, got {url!r}")
    return base if base.endswith("/ws") else base + "/ws"


class RemoteEnv(gym.Env):
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, url: str, env_kwargs: dict[str, Any] | None = None,
                 token: str | None = None, timeout_s: float = 600.0, expert: bool = False,
                 anchor: str | None = None, render_mode: str | None = None) -> None:
        self.url, self.env_kwargs = ws_url(url), dict(env_kwargs or {})
        if anchor is not None:
            self.env_kwargs["anchor"] = anchor
        self.token, self.timeout_s, self.expert = token, timeout_s, expert
        self.render_mode = render_mode
        self.observation_space, self.action_space = text_spaces()
        self._ws = None
        self._stack: contextlib.ExitStack | None = None
        self._last: str | None = None
        self._expert_action: str | None = None
        self._num_tasks: int | None = None

    # ------------------------------------------------------------------ transport
    def _connect(self):
        if self._ws is None:
            from websockets.sync.client import connect

            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            stack = contextlib.ExitStack()
            try:
                self._ws = stack.enter_context(connect(
                    self.url, additional_headers=headers,
                    open_timeout=min(self.timeout_s, 30.0), max_size=None))
                self._stack = stack
            except Exception as err:  # noqa: BLE001 - every way of not connecting
                raise RemoteEnvLost(f"cannot open a session at {self.url}: "
                                    f"{type(err).__name__}: {err}") from err
        return self._ws

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        ws = self._connect()
        try:
            ws.send(json.dumps(message))
            answer = json.loads(ws.recv(timeout=self.timeout_s))
        except Exception as err:  # noqa: BLE001 - connection lost or timed out
            answer = _last_words(ws)  # a server refusing a session says why, then closes
            self._drop()
            if answer is None:
                raise RemoteEnvLost(f"session at {self.url} lost: {type(err).__name__}: "
                                    f"{err}") from err
        if answer.get("type") == "error":
            data = answer.get("data", {})
            if data.get("code") in ("CAPACITY_REACHED", "SESSION_ERROR", "FACTORY_ERROR"):
                self._drop()
            raise RemoteEnvRefused(f"{self.url}: {data.get('message', answer)}"
                                   + (f" [{data['code']}]" if data.get("code") else ""))
        return answer.get("data", {})

    def _drop(self) -> None:
        stack, self._stack, self._ws = self._stack, None, None
        if stack is not None:
            try:
                stack.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        data = {"seed": seed, "options": options, "env_kwargs": self.env_kwargs,
                "expert": self.expert}
        payload = self._call({"type": "reset", "data": data})
        obs, _, _, _, info = decode_step(payload)
        self._after(payload)
        return obs, info

    def step(self, action: str):
        payload = self._call({"type": "step", "data": {"action": str(action)}})
        self._after(payload)
        return decode_step(payload)

    def _after(self, payload: dict[str, Any]) -> None:
        fields = payload.get("observation", payload)
        self._last = fields.get("text")
        self._expert_action = fields.get("expert_action")

    def state(self) -> dict[str, Any]:
        """The server's state of this session (env id and kwargs, step count, state key,
        number of tasks)."""
        return self._call({"type": "state"})

    @property
    def num_tasks(self) -> int:
        """How many tasks the served env has (with this env's ``env_kwargs``)."""
        if self._num_tasks is None:
            if self._last is None:
                self.reset(seed=0)
            self._num_tasks = self.state().get("num_tasks")
            if self._num_tasks is None:
                raise RemoteEnvError(f"{self.url} does not report num_tasks")
        return int(self._num_tasks)

    def expert_action(self) -> str | None:
        if not self.expert:
            raise RemoteEnvError("make the env with expert=True to receive expert actions")
        return self._expert_action

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 - the server may be gone
                pass
            self._drop()
        super().close()


def _last_words(ws) -> dict[str, Any] | None:
    """An error message the server sent before closing the connection, if any."""
    try:
        answer = json.loads(ws.recv(timeout=0.5))
    except Exception:  # noqa: BLE001 - nothing was left
        return None
    return answer if isinstance(answer, dict) and answer.get("type") == "error" else None
