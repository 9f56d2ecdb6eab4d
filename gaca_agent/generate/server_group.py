"""Several inference servers of one model as one engine (``server.replicas``).

Each episode stays on one server (its turns share a prefix there, so the server's prefix
cache is reused): its first turn goes to the server with the fewest requests in flight
(ties: the first listed), and the later ones follow it. A server that cannot be reached
or does not answer (after its retries) is dropped: the turn is sent again to another
(the request carries its sampling seed, so the answer is the one it would have given),
and its episodes move with it. When none is left the turn fails with one line naming
them all. A server started in a lost one's place joins with :meth:`ServerGroup.admit`.
Weight syncs and probes go to every server still up (:attr:`members`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from gaca_agent.generate.http import ServerTimedOut, ServerUnreachable

#: What says a server is gone (after its own retries).
GONE = (ServerUnreachable, ServerTimedOut)
#: Episodes remembered for affinity (the oldest are forgotten first).
MAX_EPISODES = 100_000


class ServersDown(ServerUnreachable):
    """No inference server of the group is left."""


class ServerGroup:
    """:class:`~gaca_agent.generate.server_engine.ServerEngine` s of the same model, one
    engine to the policies (see the module docstring)."""

    def __init__(self, engines: list) -> None:
        if not engines:
            raise ValueError("a server group needs at least one server")
        self.engines, self.kind = list(engines), engines[0].kind
        self.down: dict[int, str] = {}
        self.inflight = [0] * len(self.engines)
        self.affinity: OrderedDict[Any, int] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return ", ".join(e.base_url for e in self.engines)

    @property
    def members(self) -> list:
        """The servers still up: where weights are synced and probed."""
        with self._lock:
            return [e for i, e in enumerate(self.engines) if i not in self.down]

    def lose(self, engine, err: BaseException) -> bool:
        """Drop ``engine`` when ``err`` says it cannot be reached (a weight sync or probe
        found it gone) and another server is up; whether it was dropped."""
        gone = isinstance(err, GONE) or isinstance(err.__cause__, GONE)
        with self._lock:
            if not gone or len(self.engines) - len(self.down) < 2:
                return False
        self._drop(self.engines.index(engine), err)
        return True

    def admit(self, i: int, engine) -> None:
        """``engine`` (a new server, its weights synced) in place of server ``i``, up."""
        with self._lock:
            old, self.engines[i] = self.engines[i], engine
            self.down.pop(i, None)
            self.inflight[i] = 0
        old.close()

    def _drop(self, i: int, err: BaseException) -> None:
        with self._lock:
            self.down.setdefault(i, f"{type(err).__name__}: {err}")

    def _pick(self, episode: Any) -> int | None:
        with self._lock:
            up = [i for i in range(len(self.engines)) if i not in self.down]
            if not up:
                return None
            i = self.affinity.get(episode) if episode is not None else None
            if i not in up:
                i = min(up, key=lambda j: (self.inflight[j], j))
                if episode is not None:
                    self.affinity[episode] = i
                    while len(self.affinity) > MAX_EPISODES:
                        self.affinity.popitem(last=False)
            self.inflight[i] += 1
            return i

    def submit(self, messages: list[dict], max_tokens: int, temperature: float,
               key: int | None = None, version: int | None = None,
               episode: Any = None) -> Future:
        """A future :class:`~gaca_agent.generate.engines.Completion` from the episode's
        server (``episode``: any hashable id of the turn's episode; None: no affinity)."""
        outer: Future = Future()
        self._send(outer, (messages, max_tokens, temperature, key, version), episode)
        return outer

    def _send(self, outer: Future, args: tuple, episode: Any) -> None:
        i = self._pick(episode)
        if i is None:
            with self._lock:
                reasons = "; ".join(f"{self.engines[j].base_url}: {why}"
                                    for j, why in sorted(self.down.items()))
            outer.set_exception(ServersDown(f"every inference server is down ({reasons})"))
            return
        try:
            inner = self.engines[i].submit(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            self._settle(i)
            outer.set_exception(err)
            return

        def done(f: Future) -> None:
            self._settle(i)
            err = f.exception()
            if isinstance(err, GONE):
                self._drop(i, err)
                self._send(outer, args, episode)  # to the others
            elif err is not None:
                outer.set_exception(err)
            else:
                outer.set_result(f.result())

        inner.add_done_callback(done)

    def _settle(self, i: int) -> None:
        with self._lock:
            self.inflight[i] -= 1

    def complete(self, messages: list[dict], max_tokens: int, temperature: float,
                 key: int | None = None, version: int | None = None, episode: Any = None):
        """One chat request, answered (see :meth:`submit`)."""
        return self.submit(messages, max_tokens, temperature, key, version, episode).result()

    def busy_seconds(self) -> float:
        """The busiest server's busy seconds (the servers work side by side)."""
        return max(e.busy_seconds() for e in self.engines)

    def close(self) -> None:
        for e in self.engines:
            e.close()
