"""Starting ``gaca-env-serve`` from Python: a child process on a free loopback port,
returned once it answers (for scripts that bring their own env servers, the benchmarks
and the tests)."""

from __future__ import annotations

import sys


def start_process(env_id: str, *args: str, timeout_s: float = 120.0, port: int | None = None):
    """``gaca-env-serve ENV_ID ARGS`` in a child process on ``port`` (default: a free
    loopback port), returned
    once ``/health`` answers: ``(process, url)``. Its stderr goes to a temporary file
    (never a pipe that a long run could fill); ``--token T`` in ``args`` is sent with the
    health checks. Raises RuntimeError (with the server's last words) when it exits or
    does not answer in ``timeout_s``."""
    import subprocess
    import tempfile
    import time
    import urllib.request

    from gaca_envs.net import free_port

    port = port or free_port()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "gaca_envs.remote.service", env_id, *args,
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    token = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--token"), None)
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"gaca-env-serve exited: {log.read()[-2000:]}")
            request = urllib.request.Request(url + "/health")
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(request, timeout=2):
                    return proc, url
            except OSError:
                time.sleep(0.2)
        proc.kill()
        raise RuntimeError(f"gaca-env-serve {env_id} did not start in {timeout_s} s")
    finally:
        log.close()  # the child keeps its own descriptor
