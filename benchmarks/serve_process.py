"""A ``gaca-serve`` process for the benchmarks that need the inference server in a process
of its own (``bench_async.py``, ``gpu_check_async.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_gaca_serve(model: str, name: str, *extra: str, core: int | None = None,
                     env: dict[str, str] | None = None):
    """``gaca-serve MODEL --name NAME EXTRA`` on a free port (pinned to ``core`` with
    taskset when given): (process, its API base URL, ending in /v1), once it prints it."""
    cmd = [sys.executable, "-m", "gaca_agent.cli.serve", model, "--name", name, "--port", "0",
           "--log-level", "WARNING", *extra]
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env={**os.environ, **(env or {})})
    for line in proc.stdout:
        found = re.search(r"(http://\S+/v1)", line)
        if found:  # keep reading its output, so that the pipe never fills
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, found.group(1)
    raise RuntimeError("gaca-serve did not start")
