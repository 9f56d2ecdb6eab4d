"""``gaca/AgentGym-v0``: a client of AgentGym's HTTP environment servers.

    env = gym.make("gaca/AgentGym-v0", url="http://127.0.0.1:36001", env="textcraft",
                   num_tasks=100)

AgentGym's servers (``agentenv-textcraft``, ``-sciworld``, ``-babyai`` ...) speak a small
HTTP protocol: ``POST /create`` -> ``{"id": k}``; ``POST /reset {"id", "data_idx"}``;
``POST /step {"id", "action"}`` -> ``{"observation", "reward", "done"[, "score",
"available_actions"]}``; ``GET /observation?id=k``; where the server has them,
``GET /available_actions?id=k`` and ``POST /close {"id"}``; an ``{"error": ...}`` body
reports a failure. This env plays one server-side env per gym env, created on the first
reset and closed by :meth:`close` (servers without ``/close`` keep it; AgentGym's WebShop
server is one).

It is a :class:`~gaca_envs.core.TextEnv`, so the contract is the one every ``gaca/`` env
keeps (ASCII observations, normalised admissible actions, no-op steps after the end).
Where the protocol says less, flagged in ``info``: the server exposes no true state, so
``state_key`` is a hash of the observation text (``info["state_key_source"] ==
"observation"``: anchors are GiGPO's, with their aliasing). ``admissible_actions`` are
the server's available actions when it reports them; an action outside them is refused
like any env's. A server that reports none takes any text as typed, and its
``action_valid`` is always True (the protocol does not say). ``won``: the episode ended
with a reward (or ``score``) of at least ``win_score`` (1.0; SciWorld's servers score
0-100: ``win_score=100``). ``task_id`` is AgentGym's ``data_idx`` in
``range(num_tasks)``.
"""

from __future__ import annotations

from typing import Any

from gaca_envs.core import SimStep, TextEnv, observation_key
from gaca_envs.remote.client import RemoteEnvError, RemoteEnvLost, RemoteEnvRefused


class AgentGymEnv(TextEnv):
    def __init__(self, url: str, env: str = "", num_tasks: int | None = None,
                 create_body: dict[str, Any] | None = None, win_score: float = 1.0,
                 timeout_s: float = 300.0, render_mode: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        super().__init__(render_mode=render_mode)
        self.url, self.env_name = url.rstrip("/"), env
        self._num_tasks, self.create_body = num_tasks, dict(create_body or {})
        self.win_score, self.timeout_s = win_score, timeout_s
        self._id: int | None = None
        self._task = ""
        self._typed = ""
        self._has_actions: bool | None = None
        import requests

        self._http = requests.Session()

    # ------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, self.url + path, timeout=self.timeout_s,
                                          **kwargs)
        except Exception as err:  # noqa: BLE001 - connection refused, reset, timeout
            raise RemoteEnvLost(f"AgentGym server {self.url} lost: {type(err).__name__}: "
                                f"{err}") from err
        if response.status_code == 404:
            return _NOT_FOUND
        if response.status_code >= 400:
            raise RemoteEnvRefused(f"AgentGym server {self.url}{path}: HTTP "
                                   f"{response.status_code}: {response.text[:300]}")
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            raise RemoteEnvRefused(f"AgentGym server {self.url}{path}: {body['error']}")
        return body

    def _actions(self, payload: dict[str, Any]) -> tuple[str, ...]:
        if "available_actions" in payload:
            return tuple(str(a) for a in payload["available_actions"])
        if self._has_actions is not False:
            got = self._request("GET", "/available_actions", params={"id": self._id})
            self._has_actions = got is not _NOT_FOUND
            if self._has_actions:
                items = got.get("available_actions", got) if isinstance(got, dict) else got
                return tuple(str(a) for a in items)
        return ()

    # ------------------------------------------------------------------ simulator hooks
    @property
    def num_tasks(self) -> int:
        if self._num_tasks is None:
            raise RemoteEnvRefused("AgentGym servers do not report how many tasks they have: "
                                   "make the env with num_tasks=N")
        return self._num_tasks

    def _sim_task(self, task_id: int) -> str:
        return self._task

    def _sim_reset(self, task_id: int) -> SimStep:
        if self._id is None:
            created = self._request("POST", "/create", json=self.create_body or None)
            self._id = int(created["id"] if "id" in created else created["env_id"])
        payload = self._request("POST", "/reset", json={"id": self._id, "data_idx": task_id})
        payload = payload if isinstance(payload, dict) else {}
        obs = self._request("GET", "/observation", params={"id": self._id})
        self._task = str(payload.get("goal", payload.get("task_description", "")))
        obs = str(obs if obs is not _NOT_FOUND else payload.get("observation", ""))
        return self._sim(obs, payload, 0.0, False, False)

    def step(self, action: str):
        # kept as typed: what a server that lists no actions is sent (see _resolve)
        self._typed = action if isinstance(action, str) else ""
        return super().step(action)

    def _resolve(self, action: str) -> str | None:
        if self._last is not None and not self._last.admissible_actions:
            return self._typed  # the server lists no actions: any text is sent as typed
        return super()._resolve(action)

    def _sim_step(self, action: str) -> SimStep:
        payload = self._request("POST", "/step", json={"id": self._id, "action": str(action)})
        reward = float(payload.get("reward") or 0.0)
        done = bool(payload.get("done", False))
        won = done and float(payload.get("score", reward)) >= self.win_score
        return self._sim(str(payload.get("observation", "")), payload, reward, done, won)

    def _sim(self, obs: str, payload: dict[str, Any], reward: float, done: bool,
             won: bool) -> SimStep:
        extra: dict[str, Any] = {"state_key_source": "observation"}
        if "score" in payload:
            extra["score"] = float(payload["score"])
        return SimStep(obs, () if done else self._actions(payload), observation_key(obs),
                       reward, done, won, extra)

    def close(self) -> None:
        if self._id is not None:
            try:
                self._request("POST", "/close", json={"id": self._id})
            except RemoteEnvError:
                pass
            self._id = None
        self._http.close()
        super().close()


_NOT_FOUND = object()
