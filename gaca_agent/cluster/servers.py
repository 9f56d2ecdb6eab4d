"""Inference servers placed by Ray (``cluster.servers: N``): one :class:`ServerActor` per
server, spread over the nodes that have ``cluster.server_resources`` (a GPU each, or a
tensor-parallel group's), each starting ``cluster.server_command`` on a free port of its
node, waiting for its ``/health``, and stopping it when the run ends. The server process,
and every process it starts, dies with its actor (and so with its node:
:mod:`gaca_agent.cluster.reaper`): the run's
:class:`~gaca_agent.generate.server_group.ServerGroup` then sends that server's turns to
the others, and the run starts a new one in its place (:meth:`Fleet.replace`), which
joins at a weight sync once it is up and has the run's weights."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

from gaca_agent.cluster import reaper


KEY_VARS = ("GACA_SERVE_API_KEY", "VLLM_API_KEY")
"""The environment variables a server started for a run finds its API key in."""


class ServerActor:
    """One inference server process on this actor's node."""

    def __init__(self, command: str, fields: dict[str, str], start_timeout_s: float) -> None:
        import ray

        from gaca_envs.net import free_port

        self.host = ray.util.get_node_ip_address()
        self.port, self.api_key = free_port(), fields.get("api_key")
        words = shlex.split(command.format(**fields, host=self.host, port=self.port))
        if words and words[0] == "gaca-serve":  # this environment's, wherever PATH points
            words = [sys.executable, "-m", "gaca_agent.cli.serve", *words[1:]]
        # its output goes to a file (a pipe nobody reads would fill and stop the server)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="gaca-server-", suffix=".log")
        # the key by environment, not on the command line (which any user of the node
        # can read): gaca-serve and vLLM read these
        key_env = {v: self.api_key for v in KEY_VARS} if self.api_key else {}
        # in a process group that ends with this actor (its own workers too)
        self.proc = reaper.start(words, stdout=self.log, stderr=subprocess.STDOUT,
                                 env={**os.environ, **key_env})
        deadline = time.monotonic() + start_timeout_s
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                reaper.stop(self.proc, timeout_s=5)
                self.log.seek(0)
                tail = self.log.read()[-1500:].strip()
                shown = " ".join(words).replace(self.api_key or "\0", "***")
                raise RuntimeError(f"the inference server `{shown}` did not become "
                                   f"healthy on {self.host}:{self.port}: {tail}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        request = urllib.request.Request(f"http://{self.host}:{self.port}/health")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=2):
                return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def node_id(self) -> str:
        """The Ray node this server runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def stop(self) -> None:
        reaper.stop(self.proc)
        self.log.close()


class Fleet:
    """The inference servers of one run: started together, their URLs, stopped together;
    ``api_key``: the key made for them (``{api_key}`` in the command)."""

    def __init__(self, cluster, fields: dict[str, str]) -> None:
        import secrets

        import ray

        from gaca_agent.cluster.ray_pool import actor_options, connect

        connect(cluster)
        self.api_key = secrets.token_hex(16)
        make = ray.remote(ServerActor).options(**actor_options(cluster.server_cpus,
                                                               cluster.server_resources))
        args = (cluster.server_command, {**fields, "api_key": self.api_key},
                cluster.server_start_timeout_s)
        self._start = lambda: make.remote(*args)
        self.actors = [self._start() for _ in range(cluster.servers)]
        self.urls: list[str] = ray.get([a.url.remote() for a in self.actors],
                                       timeout=cluster.server_start_timeout_s + 60)
        self.starting: dict[int, object] = {}
        """Replacements started, not yet up: server index -> its URL's future."""

    def replace(self, lost) -> None:
        """Start a new server in place of each of ``lost`` (indices into :attr:`urls`)
        not already being replaced; Ray places it wherever its resources are free."""
        import ray

        for i in lost:
            if i in self.starting:
                continue
            try:
                ray.kill(self.actors[i], no_restart=True)
            except Exception:  # noqa: BLE001 - gone with its node
                pass
            self.actors[i] = self._start()
            self.starting[i] = self.actors[i].url.remote()

    def ready(self, wait_s: float = 0.0) -> tuple[dict[int, str], dict[int, str]]:
        """(the replacements up since the last call: index -> URL, those whose start
        failed: index -> why); each waited for at most ``wait_s`` seconds. A failed one
        is started again by the next :meth:`replace`."""
        import ray

        up, failed = {}, {}
        for i, url in list(self.starting.items()):
            if not ray.wait([url], timeout=wait_s)[0]:
                continue
            del self.starting[i]
            try:
                up[i] = self.urls[i] = ray.get(url)
            except Exception as err:  # noqa: BLE001 - said by the caller
                failed[i] = f"{type(err).__name__}: {err}"
        return up, failed

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.stop.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - gone with its node
                pass
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
