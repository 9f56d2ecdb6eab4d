"""Watching Ray's head (its GCS) from a run's driver.

When the head is lost, Ray ends the driver's process itself once it has not reached the
GCS for ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default): no Python exception is
raised, no ``finally`` runs, and the only line is Ray's own. A :class:`HeadWatch` tries
the GCS's port every few seconds on a thread and, once it has refused for ``grace_s``,
says so in one line of the run's choosing (which checkpoint is intact, how to resume)
before Ray ends the process.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable


class HeadWatch:
    """``on_lost(line)`` once, when ``address`` (``HOST:PORT``) has refused connections for
    ``grace_s`` seconds in a row; tried every ``every_s`` seconds until :meth:`close`, or
    until ``active()`` is false (this process left Ray itself)."""

    def __init__(self, address: str, on_lost: Callable[[str], None],
                 every_s: float = 2.0, grace_s: float = 15.0,
                 active: Callable[[], bool] = lambda: True) -> None:
        host, _, port = address.rpartition(":")
        self.where, self.address = (host.strip("[]"), int(port)), address
        self.on_lost, self.every_s, self.grace_s = on_lost, every_s, grace_s
        self.active = active
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gaca-head-watch",
                                        daemon=True)
        self._thread.start()

    def answers(self) -> bool:
        try:
            socket.create_connection(self.where, timeout=min(self.every_s, 5.0)).close()
            return True
        except OSError:
            return False

    def _watch(self) -> None:
        since = None  # when the head last stopped answering
        while not self._stop.wait(self.every_s) and self.active():
            if self.answers():
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= self.grace_s:
                self.on_lost(f"Ray's head (GCS at {self.address}) has not answered for "
                             f"{self.grace_s:.0f} s; Ray ends this process when its own "
                             "reconnect timeout passes (60 s by default)")
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def watch_head(on_lost: Callable[[str], None], **timing) -> HeadWatch | None:
    """A :class:`HeadWatch` of this process's Ray, or None when it has no GCS address
    here (not initialized, or a ``ray://`` client whose head is reached another way)."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a Ray client has none
        return None
    return HeadWatch(address, on_lost, active=ray.is_initialized, **timing) if address else None
