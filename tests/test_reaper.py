"""An actor's child process group (gaca_agent.cluster.reaper): a server's own workers end
with the actor that started it, whether the actor stops it or dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import alive, gone_within

ROOT = Path(__file__).resolve().parents[1]

# A stand-in actor: starts a "server" under a reaper that itself starts a worker (a
# grandchild of the actor), prints both pids, then waits to be stopped or killed.
ACTOR = """
import subprocess, sys, time
from gaca_agent.cluster import reaper

if __name__ == "__main__":
    server = reaper.start([sys.executable, "-c",
        "import subprocess, sys, time; w = subprocess.Popen(['sleep', '600']); "
        "print(w.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    worker = server.stdout.readline().strip()
    print(server.pid, worker, flush=True)
    if sys.argv[1] == "stop":
        sys.stdin.readline()  # the test has seen both alive
        reaper.stop(server)
        print("stopped", flush=True)
    time.sleep(600)
"""


def start_actor(tmp_path, how: str):
    script = tmp_path / "actor.py"
    script.write_text(ACTOR)
    actor = subprocess.Popen([sys.executable, str(script), how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    server, worker = (int(x) for x in actor.stdout.readline().split())
    assert alive(server) and alive(worker)
    return actor, server, worker


def test_a_dead_actors_server_and_its_workers_end(tmp_path):
    actor, server, worker = start_actor(tmp_path, "wait")
    actor.send_signal(signal.SIGKILL)  # the actor's process lost, as with its node
    actor.wait()
    # the kernel tells the reaper, which ends its group: generous for a loaded machine
    assert gone_within([server, worker], 60), "the server's worker outlived its actor"


def test_a_server_ends_when_ray_kills_its_actors_children_at_once(tmp_path):
    """Ray SIGKILLs an actor's direct children when its worker exits
    (RAY_kill_child_processes_on_worker_exit): the process the actor started gets no
    chance to act, and the server and its worker still end."""
    actor, server, worker = start_actor(tmp_path, "wait")
    actor.send_signal(signal.SIGKILL)
    os.kill(server, signal.SIGKILL)
    actor.wait()
    assert gone_within([worker], 60), "the server's worker outlived its actor's children"


def test_stopping_a_server_ends_its_workers_too(tmp_path):
    actor, server, worker = start_actor(tmp_path, "stop")
    try:
        actor.stdin.write("go\n")
        actor.stdin.flush()
        assert actor.stdout.readline().strip() == "stopped"
        assert gone_within([server, worker], 60)
    finally:
        actor.kill()
        actor.wait()


def test_a_server_that_ignores_sigterm_is_killed_after_stops_timeout():
    """reaper.stop's SIGTERM reaches a server that ignores it: the group is SIGKILLed
    after stop's own timeout, not after the reaper's longer grace (GRACE_S)."""
    import time

    from gaca_agent.cluster import reaper

    server = reaper.start([sys.executable, "-c",
                           "import signal, subprocess, time; "
                           "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "w = subprocess.Popen(['sleep', '600']); "
                           "print(w.pid, flush=True); time.sleep(600)"],
                          stdout=subprocess.PIPE, text=True)
    try:
        worker = int(server.stdout.readline())
        assert alive(server.pid) and alive(worker)
        begun = time.monotonic()
        reaper.stop(server, timeout_s=0.5)
        # SIGKILL and a wait take milliseconds; the reaper alone would take GRACE_S
        assert time.monotonic() - begun < reaper.GRACE_S - 4
        assert server.returncode == -signal.SIGKILL
        assert gone_within([worker], 60), "the server's worker outlived stop()"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_a_lost_actors_server_is_given_its_grace_to_shut_down(tmp_path):
    """When the actor is lost (here its anchor process is killed), the server is asked to
    stop (SIGTERM) and given the reaper's grace before the group is SIGKILLed: a server
    that takes half a second to shut down cleanly finishes doing so."""
    from gaca_agent.cluster import reaper

    done = tmp_path / "done"
    server = reaper.start([sys.executable, "-c",
                           "import os, signal, sys, time\n"
                           "def bye(*_):\n"
                           "    time.sleep(0.5)\n"
                           "    open(sys.argv[1], 'w').write('clean')\n"
                           "    sys.exit(0)\n"
                           "signal.signal(signal.SIGTERM, bye)\n"
                           "print(os.getpid(), flush=True)\n"
                           "time.sleep(600)", str(done)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(server.stdout.readline())
        os.kill(server.pid, signal.SIGKILL)  # the anchor: as when its actor dies
        server.wait()
        assert gone_within([pid], 60), "the server outlived its actor"
        assert done.exists() and done.read_text() == "clean", \
            "the server was killed before its shutdown finished"
    finally:
        reaper._signal_group(server.pid, signal.SIGKILL)  # what is left, if anything
