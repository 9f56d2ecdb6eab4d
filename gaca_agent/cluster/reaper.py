"""A process that an actor starts (an inference server, a learner rank), and every process
that one starts in turn, ended with the actor: ``python -m gaca_agent.cluster.reaper
PARENT_PID -- COMMAND...``.

The reaper leads a process group of its own (the actor starts it with
``start_new_session``, which needs no Python code between fork and exec: safe in Ray's
threaded worker). It asks the kernel for SIGTERM when its parent (the actor) dies, runs
COMMAND in its group, and when its parent dies, or it is told to stop, it ends the whole
group: a vLLM server's own worker processes too, not only the direct child. It exits
with COMMAND's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: Seconds between SIGTERM to the group and SIGKILL to what is left of it.
GRACE_S = 10.0


def start(command: list[str], **popen) -> subprocess.Popen:
    """Start ``command`` under a reaper tied to this process; its ``pid`` is the group's."""
    return subprocess.Popen([sys.executable, "-m", "gaca_agent.cluster.reaper",
                             str(os.getpid()), "--", *command], start_new_session=True,
                            **popen)


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """End the group a :func:`start` made: SIGTERM, then SIGKILL after ``timeout_s``."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _end_group(child: subprocess.Popen) -> None:
    """SIGTERM to the group but this process, SIGKILL to what is left after a grace."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches us too
    _signal_group(os.getpgid(0), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(os.getpgid(0), signal.SIGKILL)  # the rest, and this process last


def main(argv: list[str]) -> int:
    import ctypes

    parent, command = int(argv[0]), argv[argv.index("--") + 1:]
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    if os.getppid() != parent:  # the parent died before the line above
        return 1
    child = subprocess.Popen(command)
    while child.poll() is None:
        if stopping:
            _end_group(child)
        time.sleep(0.2)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
