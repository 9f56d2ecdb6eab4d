"""gaca-env-serve under a long soak with misbehaving clients.

    python benchmarks/soak_env_server.py --env diag --minutes 30          # 64 sessions
    python benchmarks/soak_env_server.py --env alfworld --minutes 30
    python benchmarks/soak_env_server.py --env diag --minutes 1 --clients 16   # short

N client threads play episodes of random admissible actions over ``gaca/Remote-v0``. At
random, instead of a normal episode a client: drops its connection mid-episode without a
close frame (then reconnects with a new session), or opens a raw WebSocket and sends a
malformed frame (bad JSON, wrong types, a binary frame, a frame over the size limit),
or leaves a session open and idle. At the end every client stops; the script waits for
the server's idle timeout and reads ``/sessions``.

Reported: steps and episodes, client errors in normal episodes (must be 0), the server's
error lines (tracebacks, ``ERROR``: must be 0), sessions left after the idle timeout
(must be 0), and the server's RSS every 10 s with its least-squares slope after the first
fifth of the run (MB per minute; flat means no leak). ``--json PATH`` writes it all.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gymnasium as gym  # noqa: E402

import gaca_envs  # noqa: E402
from gaca_envs.net import free_port  # noqa: E402
from reliability_common import (alfworld_kwargs, rss_mb, slope_mb_per_min,  # noqa: E402
                                write_report)

gym.register_envs(gaca_envs)
MALFORMED = ["not json", '{"type": 5}', '{"type": "step"}', '{"type": "step", "data": 3}',
             '{"type": "reset", "data": {"seed": "x"}}', b"\x00\x01binary", "[1, 2]",
             '{"type": "step", "data": {"action": {"action": 7}}}', "x" * ((1 << 20) + 1)]


def get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=30).read())


class Client(threading.Thread):
    def __init__(self, i: int, url: str, split: str, stop: float, chaos: float) -> None:
        super().__init__(daemon=True)
        self.i, self.url, self.split, self.stop, self.chaos = i, url, split, stop, chaos
        self.rng = random.Random(i)
        self.steps = self.episodes = self.drops = self.malformed = self.idle = 0
        self.errors: list[str] = []
        self.held: list = []  # idle sessions left open until the end

    def run(self) -> None:
        while time.time() < self.stop:
            roll = self.rng.random()
            try:
                if roll < self.chaos / 3:
                    self.drop_mid_episode()
                elif roll < 2 * self.chaos / 3:
                    self.send_malformed()
                elif roll < self.chaos:
                    self.leave_idle()
                else:
                    self.episode()
            except Exception as err:  # noqa: BLE001 - counted and reported
                self.errors.append(f"{type(err).__name__}: {err}"[:300])

    def _env(self):
        return gym.make("gaca/Remote-v0", url=self.url, env_kwargs={"split": self.split})

    def _play(self, env, max_steps: int) -> None:
        _, info = env.reset(seed=self.rng.randrange(1 << 30))
        for _ in range(max_steps):
            acts = info["admissible_actions"]
            _, _, term, trunc, info = env.step(self.rng.choice(acts))
            self.steps += 1
            if term or trunc:
                break

    def episode(self) -> None:
        env = self._env()
        try:
            self._play(env, 200)
            self.episodes += 1
        finally:
            env.close()

    def drop_mid_episode(self) -> None:
        """A few steps, then the TCP connection is cut without a close frame."""
        env = self._env()
        self._play(env, self.rng.randint(1, 5))
        ws = env.unwrapped._ws
        ws.socket.close()
        env.unwrapped._ws = None  # the client forgets it: no close frame is ever sent
        self.drops += 1

    def send_malformed(self) -> None:
        from websockets.sync.client import connect

        from gaca_envs.remote.client import ws_url

        with connect(ws_url(self.url), max_size=None, open_timeout=30) as ws:
            ws.send(self.rng.choice(MALFORMED))
            try:
                ws.recv(timeout=30)  # an error message, or a close for an oversized frame
            except Exception:  # noqa: BLE001 - a close is an answer too
                pass
        self.malformed += 1

    def leave_idle(self) -> None:
        if len(self.held) < 2:
            env = self._env()
            env.reset(seed=0)
            self.held.append(env)  # open and silent until the end: the reaper's job
            self.idle += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=["diag", "alfworld"], default="diag")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--chaos", type=float, default=0.15,
                   help="share of a client's turns that misbehave (drop, malformed, idle)")
    p.add_argument("--idle-timeout", type=float, default=30.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.env == "alfworld":
        env_id, kwargs = "gaca/ALFWorld-v0", alfworld_kwargs()
    else:
        env_id, kwargs = "gaca/Diag-Corridor-v0", {"split": "test"}
    port, log = free_port(), tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "gaca_envs.remote.service", env_id,
                             *[f"{k}={v}" for k, v in kwargs.items()], "--port", str(port),
                             "--max-sessions", str(3 * args.clients + 8),
                             "--idle-timeout", str(args.idle_timeout)],
                            stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            get(url + "/health")
            break
        except OSError:
            time.sleep(0.2)
    start = time.time()
    stop = start + 60 * args.minutes
    clients = [Client(i, url, kwargs["split"], stop, args.chaos) for i in range(args.clients)]
    for c in clients:
        c.start()
    rss: list[tuple[float, float]] = []
    while any(c.is_alive() for c in clients):
        rss.append((round(time.time() - start, 1), round(rss_mb(proc.pid), 1)))
        time.sleep(10)
    rss.append((round(time.time() - start, 1), round(rss_mb(proc.pid), 1)))
    at_end = get(url + "/sessions")["active"]
    held = sum(len(c.held) for c in clients)
    time.sleep(args.idle_timeout + max(args.idle_timeout / 4, 5) + 5)
    after_idle = get(url + "/sessions")["active"]
    proc.kill()
    proc.wait()
    log.seek(0)
    server_log = log.read()
    error_lines = [x for x in server_log.splitlines() if "Traceback" in x or "ERROR" in x]
    warm = [s for s in rss if s[0] >= 0.2 * 60 * args.minutes]
    report = {
        "env": env_id, "clients": args.clients, "minutes": args.minutes, "chaos": args.chaos,
        "steps": sum(c.steps for c in clients),
        "episodes": sum(c.episodes for c in clients),
        "dropped_connections": sum(c.drops for c in clients),
        "malformed_frames": sum(c.malformed for c in clients),
        "idle_sessions_left_open": held,
        "client_errors": sum(len(c.errors) for c in clients),
        "first_client_errors": [e for c in clients for e in c.errors][:5],
        "server_error_lines": len(error_lines), "first_server_errors": error_lines[:5],
        "sessions_at_end": at_end, "sessions_after_idle_timeout": after_idle,
        "rss_mb_start": rss[0][1], "rss_mb_after_warmup": warm[0][1] if warm else None,
        "rss_mb_end": rss[-1][1], "rss_slope_mb_per_min_after_warmup":
            round(slope_mb_per_min(warm), 3), "rss_samples": rss}
    write_report(report, args.json)


if __name__ == "__main__":
    main()
