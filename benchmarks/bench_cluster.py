"""Env workers as Ray actors against worker processes, side by side in one invocation.

    python benchmarks/bench_cluster.py                      # Diag and ALFWorld
    python benchmarks/bench_cluster.py --suites diag --repeats 5

1. **Throughput** (per suite): the same episodes (the random policy, keyed by seed, so
   both play the same steps) collected by 2 local worker processes and by 2 Ray actors
   on a Ray started here, alternated ``--repeats`` times after a warm-up; env steps per
   second (medians), and Ray's overhead per env step, (t_ray - t_local) / steps.
2. **Memory**: the resident set of each worker process and each env actor after the
   runs (``VmRSS``; both hold the same envs).
3. **Recovery**: a simulated cluster (a CPU-less head, two nodes); one node removed
   after the second round, with ``env.rerun_lost: 2``: the seconds the collection took
   beyond the same collection without the loss (the lost actor's replacement, and its
   episodes played again), medians over ``--repeats``.

ALFWorld needs its data (``$GACA_DATA``); the suite is skipped with a line without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from gaca_agent.cluster.ray_pool import ray_pool
from gaca_agent.collect.collector import Collector
from gaca_agent.config import ClusterSection, EnvSection
from gaca_agent.policies import make_policy

SUITES = {"diag": ("gaca/Diag-Corridor-v0", {"split": "test"}, 16),
          "alfworld": ("gaca/ALFWorld-v0", {"split": "valid_seen"}, 140)}


def section(suite: str, **extra) -> EnvSection:
    env_id, kwargs, _ = SUITES[suite]
    return EnvSection(id=env_id, kwargs=kwargs, workers=2, max_live_envs=8,
                      invalid_penalty=0.0, **extra)


def timed(collector: Collector, tasks, **run) -> tuple[float, int]:
    t0 = time.perf_counter()
    rollout = collector.run(make_policy("random", seed=1), tasks, 1, **run)
    elapsed = time.perf_counter() - t0
    failed = [e.error for e in rollout.episodes if e.failed]
    assert not failed, f"{len(failed)} episodes failed: {failed[0]}"
    return elapsed, sum(e.length for e in rollout.episodes)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def throughput(suite: str, episodes: int, repeats: int) -> dict:
    """Local workers against Ray actors on the same tasks, alternated."""
    import ray

    n_tasks = SUITES[suite][2]
    tasks = [(k * 7 % n_tasks, 1000 + k) for k in range(episodes)]
    ray.init(address="local", num_cpus=2, object_store_memory=128 << 20,
             include_dashboard=False, log_to_driver=False)
    local = Collector(section(suite))
    env = section(suite)
    actors = Collector(env, pool=ray_pool(env.spec, env.hosts,
                                          ClusterSection(backend="ray", env_actors=2)))
    out: dict = {"local": [], "ray": [], "steps": 0}
    try:
        for c in (local, actors):  # start the hosts, import the envs, warm their caches
            timed(c, tasks[:4])
        for _ in range(repeats):
            for name, c in (("local", local), ("ray", actors)):
                seconds, steps = timed(c, tasks)
                out[name].append(seconds)
                out["steps"] = steps
        out["rss_mb"] = {"worker_process": [round(rss_mb(p), 1) for p in local.pool.pids()],
                         "ray_actor": [round(rss_mb(p), 1) for p in actors.pool.pids()]}
    finally:
        local.close()
        actors.close()
        ray.shutdown()
    t_local, t_ray = statistics.median(out["local"]), statistics.median(out["ray"])
    out.update(steps_per_s_local=round(out["steps"] / t_local, 1),
               steps_per_s_ray=round(out["steps"] / t_ray, 1),
               ray_overhead_pct=round(100 * (t_ray / t_local - 1), 1),
               ray_overhead_ms_per_step=round(1000 * (t_ray - t_local) / out["steps"], 3))
    return out


def recovery(suite: str, episodes: int, repeats: int) -> dict:
    """Seconds a node's loss adds to a collection on a simulated two-node cluster."""
    import ray
    from ray.cluster_utils import Cluster

    n_tasks = SUITES[suite][2]
    tasks = [(k * 7 % n_tasks, 2000 + k) for k in range(episodes)]
    clean, faulty = [], []
    for _ in range(repeats):
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": 80 << 20, "include_dashboard": False})
        nodes = [cluster.add_node(num_cpus=1, resources={"envhost": 2},
                                  object_store_memory=80 << 20) for _ in range(2)]
        ray.init(address=cluster.address, log_to_driver=False)
        spec = ClusterSection(backend="ray", address=cluster.address, env_actors=2,
                              env_cpus=0.5, env_resources={"envhost": 1})
        try:
            env = section(suite, rerun_lost=2)
            c = Collector(env, pool=ray_pool(env.spec, env.hosts, spec))
            timed(c, tasks[:4])  # placed and warm
            clean.append(timed(c, tasks)[0])
            rounds = []

            def lose(n):
                rounds.append(n)
                if len(rounds) == 2:
                    cluster.remove_node(nodes[1])

            faulty.append(timed(c, tasks, on_step=lose)[0])
            c.close()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return {"clean_s": [round(x, 2) for x in clean], "node_lost_s": [round(x, 2) for x in faulty],
            "recovery_s": round(statistics.median(faulty) - statistics.median(clean), 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES))
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    report = {}
    for suite in args.suites:
        try:
            import gymnasium as gym

            import gaca_envs

            gym.register_envs(gaca_envs)
            gym.make(SUITES[suite][0], **SUITES[suite][1]).close()  # its data is found
            report[suite] = {"throughput": throughput(suite, args.episodes, args.repeats),
                             "recovery": recovery(suite, args.episodes, args.repeats)}
        except FileNotFoundError as err:
            print(f"{suite}: skipped ({err})", flush=True)
            continue
        print(suite, json.dumps(report[suite]), flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
