"""gaca-env-serve on loopback: per-step overhead over a local env, and a soak test.

    python benchmarks/bench_env_server.py                      # Diag 64 + ALFWorld 16, 120 s each
    python benchmarks/bench_env_server.py --seconds 30 --skip-alfworld

1. Overhead: median step time of one ``gaca/Remote-v0`` session vs the same env in this
   process, same seeds and actions, interleaved (target: under 2 ms more on Diag).
2. Soak: N client threads, each with its own session, reset and step random admissible
   actions for the given time; reports steps, errors, sessions left after close (must be
   0) and the server's RSS after the first minute vs at the end (flat = no leak).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gaca_envs  # noqa: E402
from gaca_envs.data import data_path  # noqa: E402
from gaca_envs.remote.launch import start_process  # noqa: E402

gym.register_envs(gaca_envs)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sessions(url: str) -> int:
    return json.loads(urllib.request.urlopen(url + "/sessions", timeout=10).read())["active"]


def overhead(env_id: str, kwargs: dict, url: str, steps: int) -> dict:
    local = gym.make(env_id, **kwargs)
    remote = gym.make("gaca/Remote-v0", url=url, env_kwargs={"split": kwargs["split"]})
    rng = np.random.default_rng(0)
    t_local, t_remote = [], []
    info = None
    episode = 0
    while len(t_local) < steps:
        if info is None:
            local.reset(seed=episode, options={"task_id": episode % local.unwrapped.num_tasks})
            _, info = remote.reset(seed=episode,
                                   options={"task_id": episode % local.unwrapped.num_tasks})
            episode += 1
        acts = info["admissible_actions"]
        action = acts[rng.integers(len(acts))]
        t0 = time.perf_counter()
        a = local.step(action)
        t1 = time.perf_counter()
        b = remote.step(action)
        t2 = time.perf_counter()
        assert a == b, "remote and local differ"
        t_local.append(t1 - t0)
        t_remote.append(t2 - t1)
        info = None if (a[2] or a[3]) else a[4]
    local.close()
    remote.close()
    ml, mr = statistics.median(t_local) * 1e3, statistics.median(t_remote) * 1e3
    return {"steps": steps, "local_ms": round(ml, 3), "remote_ms": round(mr, 3),
            "overhead_ms": round(mr - ml, 3)}


def soak(url: str, split: str, clients: int, seconds: float, pid: int) -> dict:
    stop = time.time() + seconds
    counts = [0] * clients
    errors: list[str] = []
    rss: list[tuple[float, float]] = []
    t_start = time.time()

    def client(i: int) -> None:
        env = gym.make("gaca/Remote-v0", url=url, env_kwargs={"split": split})
        rng = np.random.default_rng(i)
        info = None
        try:
            while time.time() < stop:
                if info is None:
                    _, info = env.reset(seed=int(rng.integers(1 << 30)))
                acts = info["admissible_actions"]
                _, _, terminated, truncated, info = env.step(acts[rng.integers(len(acts))])
                counts[i] += 1
                if terminated or truncated:
                    info = None
        except Exception as err:  # noqa: BLE001 - counted and reported
            errors.append(f"{type(err).__name__}: {err}")
        finally:
            env.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        rss.append((round(time.time() - t_start, 1), round(rss_mb(pid), 1)))
        time.sleep(5)
    for t in threads:
        t.join()
    time.sleep(1.0)
    after_minute = next((m for s, m in rss if s >= 60), rss[len(rss) // 2][1])
    return {"clients": clients, "seconds": seconds, "steps": sum(counts),
            "steps_per_s": round(sum(counts) / seconds, 1), "errors": len(errors),
            "first_errors": errors[:3], "sessions_after_close": sessions(url),
            "rss_mb_after_first_minute": after_minute, "rss_mb_end": rss[-1][1],
            "rss_samples": rss}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--steps", type=int, default=500, help="overhead: steps measured")
    p.add_argument("--skip-alfworld", action="store_true")
    p.add_argument("--skip-diag", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    report = {}
    cases = [] if args.skip_diag else [("gaca/Diag-Signs-v0", {"split": "test"}, 64)]
    data = data_path("alfworld")
    if not args.skip_alfworld and data is not None:
        cases.append(("gaca/ALFWorld-v0", {"split": "valid_seen", "data_dir": str(data)}, 16))
    for env_id, kwargs, clients in cases:
        proc, url = start_process(env_id, *[f"{k}={v}" for k, v in kwargs.items()],
                                  "--max-sessions", str(clients + 4), timeout_s=120)
        try:
            steps = args.steps if env_id != "gaca/ALFWorld-v0" else max(50, args.steps // 10)
            row = {"overhead": overhead(env_id, kwargs, url, steps)}
            print(env_id, "overhead", row["overhead"], flush=True)
            row["soak"] = soak(url, kwargs["split"], clients, args.seconds, proc.pid)
            print(env_id, "soak", {k: v for k, v in row["soak"].items()
                                   if k != "rss_samples"}, flush=True)
            report[env_id] = row
        finally:
            proc.kill()
            proc.wait()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
