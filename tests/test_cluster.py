"""cluster.backend: ray on a simulated cluster (``ray.cluster_utils.Cluster``: several
raylets on this machine, each a node with its own resources): env actors run the same
env code as worker processes and play the same rollouts, spread over the nodes; a node
lost mid-collection loses no episode."""

from __future__ import annotations

import pytest

from conftest import has_module
from gaca_agent.cluster.ray_pool import ray_pool
from gaca_agent.collect.collector import Collector
from gaca_agent.config import ClusterSection, EnvSection
from gaca_agent.policies import make_policy

pytestmark = pytest.mark.skipif(not has_module("ray"),
                                reason="needs Ray (pip install -e '.[ray]')")
CORRIDOR = "gaca/Diag-Corridor-v0"
TASKS = [(k, 90 + k) for k in range(4)]


def test_a_ray_started_for_a_run_listens_on_loopback_only():
    """A run with no cluster.address starts a Ray on this machine: its services (GCS,
    raylet) listen on 127.0.0.1, not on the address other hosts reach, and its actors'
    node is 127.0.0.1. The run's placement is checked against that Ray's nodes."""
    import psutil
    import ray

    from gaca_agent.cluster.ray_pool import check_placement, connect

    connect(ClusterSection(backend="ray", object_store_mb=80))
    try:
        assert check_placement(ClusterSection(backend="ray", env_cpus=0.25), 1) is None
        assert check_placement(ClusterSection(backend="ray", env_cpus=64), 1).startswith(
            "2 env actors (1 per collector, 2 collectors per learner process, 1 process): "
            "no node has {'CPU': 64.0}")
        context = ray.get_runtime_context()
        assert context.gcs_address.startswith("127.0.0.1:")
        assert ray.get(ray.remote(ray.util.get_node_ip_address).remote()) == "127.0.0.1"
        # this Ray's own services (another Ray may run beside it on this machine): the
        # GCS listening on its address's port, the raylet of this node
        gcs_port = int(context.gcs_address.rsplit(":", 1)[1])
        listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        services = {c.pid for c in listening if c.laddr.port == gcs_port} | {
            p.pid for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "raylet"
            and f"--node_id={context.get_node_id()}" in (p.info["cmdline"] or [])}
        bound = {c.laddr.ip for c in listening if c.pid in services}
    finally:
        ray.shutdown()
    assert len(services) == 2 and bound <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, bound


def test_an_actor_killed_mid_collection_is_replaced_and_its_episodes_replayed():
    """One Ray on this machine: two env actors play the local rollout; one killed
    mid-collection is replaced (a restart), and with env.rerun_lost its episodes are
    played again; the actors' processes are not this one."""
    import os

    import ray

    ray.init(address="local", num_cpus=2, object_store_memory=80 << 20,
             include_dashboard=False, log_to_driver=False)
    try:
        local = Collector(EnvSection(id=CORRIDOR, kwargs={"split": "test"}, max_live_envs=4,
                                     invalid_penalty=-0.1, workers=2))
        expected, _ = played(local)
        c = collector("", resources=(), rerun_lost=1)
        first = c.pool.pids()
        assert len(set(first)) == 2 and os.getpid() not in first
        rounds = []

        def kill_an_actor(n):
            rounds.append(n)
            if len(rounds) == 2:
                ray.kill(c.pool._actors[1], no_restart=True)

        rollout, pool = played(c, on_step=kill_an_actor)
        assert episodes_of(rollout) == episodes_of(expected)
        assert pool.restarts == 1
        assert pool._actors == [None, None]  # closed
    finally:
        ray.shutdown()


def test_a_server_that_does_not_start_stops_the_run_with_its_own_words():
    import time

    import ray

    from gaca_agent.cluster.servers import Fleet

    ray.init(address="local", num_cpus=1, object_store_memory=80 << 20,
             include_dashboard=False, log_to_driver=False)
    try:
        spec = ClusterSection(backend="ray", servers=1, server_cpus=0.5,
                              server_start_timeout_s=600, server_command=(
                                  "python3 -c \"print('no weights at {model}'); exit(3)\""))
        t0 = time.monotonic()
        with pytest.raises(Exception, match="did not become healthy.*no weights at /m"):
            Fleet(spec, {"model": "/m", "name": "tiny"})
        assert time.monotonic() - t0 < 120  # when it exits, not at the start timeout
    finally:
        ray.shutdown()


def test_an_actors_request_is_what_the_section_asks():
    """CPUs, memory in bytes, custom resources as numbers, spread, never restarted by Ray
    (the pool or fleet replaces a lost actor itself)."""
    from gaca_agent.cluster.ray_pool import actor_options

    assert actor_options(0.5, {"webshop_index": 1}, 1500) == {
        "num_cpus": 0.5, "scheduling_strategy": "SPREAD", "max_restarts": 0,
        "memory": 1500 << 20, "resources": {"webshop_index": 1.0}}
    assert actor_options(2, {}) == {"num_cpus": 2, "scheduling_strategy": "SPREAD",
                                    "max_restarts": 0}


def test_a_request_is_checked_against_the_nodes_before_anything_starts():
    """A request no node holds, or requests that add up past the cluster, are one line."""
    from gaca_agent.cluster.fit import fit_problem

    nodes = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0, "webshop_index": 4.0}]
    assert fit_problem([{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0}], nodes, "x") is None
    assert fit_problem([{"CPU": 1.0, "GPU": 0.0}] * 6, nodes, "x") is None
    assert fit_problem([{"CPU": 1.0, "GPU": 2.0}], nodes, "2 ranks") == \
        ("2 ranks: no node has {'CPU': 1.0, 'GPU': 2.0} (the nodes have "
         "[{'CPU': 4.0, 'GPU': 1.0}, {'CPU': 2.0, 'GPU': 0.0}])")
    assert fit_problem([{"CPU": 2.5}] * 3, nodes, "3 actors") == \
        "3 actors: 3 of them ask for 7.5 CPU in all; the cluster has 6"
    assert "no node has {'CPU': 3.0, 'webshop_index': 1.0}" in \
        fit_problem([{"CPU": 3.0, "webshop_index": 1.0}], nodes, "x")


def test_a_runs_placement_is_data_checked_whole_and_printed_by_dry_run(capsys):
    """The three roles from the cluster section; each fits alone but not together: one
    line naming the plan. --dry-run prints the plan (without starting Ray)."""
    from gaca_agent.cli.train import main
    from gaca_agent.cluster.fit import placement, plan_problem

    spec = ClusterSection(backend="ray", env_actors=3, env_cpus=1.0, servers=1,
                          server_cpus=1.0, server_resources={"GPU": 1}, learners=2,
                          learner_cpus=2.0, learner_gpus=1)
    roles = placement(spec, env_workers=1)
    # env actors: 3 per collector, a training and a held-out collector in each of 2 ranks
    assert [(r.name.split(" (")[0], r.count) for r in roles] == [
        ("env actors", 12), ("inference servers", 1), ("learner ranks", 2)]
    assert roles[2].resources == {"CPU": 2.0, "GPU": 1.0}
    assert roles[1].line() == "1 inference servers, each CPU 1, GPU 1"
    assert plan_problem(roles, [{"CPU": 10.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}]) is None
    together = plan_problem(roles, [{"CPU": 10.0, "GPU": 2.0}, {"CPU": 8.0}])
    assert together.startswith("the plan (12 env actors (3 per collector, 2 collectors per "
                               "learner process, 2 processes), each CPU 1; ")
    assert together.endswith("15 of them ask for 3 GPU in all; the cluster has 2")
    assert plan_problem(roles, [{"CPU": 20.0, "GPU": 0.5}, {"CPU": 1.0, "GPU": 4.0}]) \
        .startswith("2 learner ranks: no node has")
    assert placement(ClusterSection(backend="ray"), env_workers=4)[0].count == 8
    assert main(["--config", "default", "--dry-run", "cluster.backend=ray",
                 "cluster.env_actors=2", "cluster.env_cpus=0.5"]) == 0
    out = capsys.readouterr().out
    assert "# placement (cluster.backend: ray)" in out
    assert "4 env actors (2 per collector, 2 collectors per learner process, 1 process), " \
        "each CPU 0.5" in out


def test_each_role_asks_for_its_memory_and_custom_resources():
    """An env actor's memory (MB in the config, bytes for Ray) and each role's custom
    resources are part of what it asks for, so a node without them is no place for it."""
    from gaca_agent.cluster.fit import placement, plan_problem

    spec = ClusterSection(backend="ray", env_cpus=0.5, env_memory_mb=512,
                          env_resources={"webshop_index": 1}, learners=1,
                          learner_resources={"fast_disk": 2})
    roles = placement(spec, env_workers=1)
    assert roles[0].resources == {"CPU": 0.5, "memory": 512.0 * 2**20, "webshop_index": 1.0}
    assert roles[1].resources == {"CPU": 1.0, "GPU": 0.0, "fast_disk": 2.0}
    node = {"CPU": 8.0, "memory": 4096.0 * 2**20, "webshop_index": 4.0, "fast_disk": 2.0}
    assert plan_problem(roles, [node]) is None
    assert "no node has {'CPU': 0.5, 'memory': 536870912.0, 'webshop_index': 1.0}" in \
        plan_problem(roles, [{**node, "memory": 256.0 * 2**20}])
    assert "no node has {'CPU': 1.0, 'fast_disk': 2.0}" in \
        plan_problem(roles, [{**node, "fast_disk": 1.0}])


@pytest.mark.slow
def test_gaca_train_refuses_a_plan_its_ray_cannot_hold_before_anything_starts(tmp_path):
    """On a Ray it starts for itself (this machine's CPUs), env actors asking for 64 CPUs
    each: one line, exit code 2, no run folder."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--config",
                           "default", "cluster.backend=ray", "cluster.env_cpus=64",
                           f"out_dir={tmp_path}", "name=r"], capture_output=True, text=True,
                          env={**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
                          timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot place 2 env actors (1 per collector, 2 collectors per learner process, " \
        "1 process): no node has {'CPU': 64.0}" in done.stderr
    assert not (tmp_path / "r").exists()


def test_env_actors_the_cluster_has_no_room_for_stop_the_run_with_what_they_asked():
    """Not a wait of env.timeout_s per call, forever: requests past what the nodes hold
    are one error at once, naming them; room taken by others is waited for timeout_s."""
    import time

    import ray

    from gaca_agent.cluster.ray_pool import RayPool

    ray.init(address="local", num_cpus=1, object_store_memory=80 << 20,
             include_dashboard=False, log_to_driver=False)
    try:
        spec = ClusterSection(backend="ray", env_cpus=0.75, env_memory_mb=16)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"cannot place 2 env actors: 2 of them ask for "
                                               r"1.5 CPU in all; the cluster has 1 \(lower"):
            RayPool(CORRIDOR, {"split": "test"}, 2, 2, spec, timeout_s=300)
        assert time.monotonic() - t0 < 60
        # room another job holds: the requests fit the nodes, so they wait, timeout_s
        busy = ray.remote(num_cpus=0.5)(type("Busy", (), {"ping": lambda self: 1})).remote()
        ray.get(busy.ping.remote())
        with pytest.raises(RuntimeError, match=r"of 2 env actors asking for 0.3 CPU, 16 MB "
                                               r"and \{\} each were not placed within 3 s"):
            RayPool(CORRIDOR, {"split": "test"}, 2, 2,
                    ClusterSection(backend="ray", env_cpus=0.3, env_memory_mb=16), timeout_s=3)
    finally:
        ray.shutdown()


@pytest.fixture
def cluster():
    """A head without CPUs (nothing runs there) and two nodes with room for two env
    actors each (the custom resource ``envhost`` stands for what env actors need)."""
    import ray
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 << 20, "include_dashboard": False})
    nodes = [made.add_node(num_cpus=2, resources={"envhost": 2},
                           object_store_memory=80 << 20) for _ in range(2)]
    ray.init(address=made.address, log_to_driver=False)
    yield made, nodes
    ray.shutdown()
    made.shutdown()


def collector(address, resources=(("envhost", 1),), **env):
    section = EnvSection(id=CORRIDOR, kwargs={"split": "test"}, max_live_envs=4,
                         invalid_penalty=-0.1, **{"workers": 2, **env})
    return Collector(section, pool=ray_pool(section.spec, section.hosts, ClusterSection(
        backend="ray", address=address, env_actors=2, env_cpus=0.5,
        env_resources=dict(resources))))


def played(c, **run):
    try:
        return c.run(make_policy("random", seed=6), TASKS, 2, **run), c.pool
    finally:
        c.close()


def episodes_of(rollout):
    t = rollout.table
    return [(e.task_id, e.seed, e.traj, e.failed, e.won,
             [(t["action_text"][r], float(t["reward"][r])) for r in e.rows])
            for e in rollout.episodes]


@pytest.mark.slow
def test_env_actors_spread_over_the_nodes_and_play_the_local_rollout(cluster):
    local = Collector(EnvSection(id=CORRIDOR, kwargs={"split": "test"}, max_live_envs=4,
                                 invalid_penalty=-0.1, workers=2))
    expected, _ = played(local)
    c = collector(cluster[0].address)
    nodes = c.pool.nodes()
    assert len(set(nodes)) == 2  # one actor on each node
    assert set(nodes) == {n.node_id for n in cluster[1]}
    rollout, pool = played(c)
    assert episodes_of(rollout) == episodes_of(expected)
    assert pool.restarts == 0


@pytest.mark.slow
def test_a_node_lost_mid_collection_loses_no_episode(cluster):
    made, nodes = cluster
    expected, _ = played(collector(made.address))
    c = collector(made.address, rerun_lost=2)
    rounds = []

    def lose_a_node(n):
        rounds.append(n)
        if len(rounds) == 2:
            made.remove_node(nodes[1])

    rollout, pool = played(c, on_step=lose_a_node)
    assert episodes_of(rollout) == episodes_of(expected)
    assert not any(e.failed for e in rollout.episodes)
    assert pool.restarts >= 1


@pytest.mark.slow
def test_a_training_run_on_ray_logs_the_local_runs_metrics(cluster, tmp_path, fresh_accelerate,
                                                          monkeypatch):
    """gaca-train with cluster.backend: ray (env actors on the nodes) gives the metrics of
    the same run with local worker processes."""
    import json

    from gaca_agent.cluster.ray_pool import RayPool
    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train

    started = []
    start = RayPool._start
    monkeypatch.setattr(RayPool, "_start", lambda pool, w: (started.append(w), start(pool, w)))

    base = ["iterations=2", "eval_every=2", "checkpoint_every=0", "env.groups=2",
            "env.group_size=2", "env.max_live_envs=4", "env.eval_episodes=4", "env.workers=2",
            "warmup.bc_steps=5", "warmup.bc_episodes=2", "model.max_new_tokens=12",
            f"out_dir={tmp_path}"]
    local = train(load_config("gaca_agent/configs/default.yaml", [*base, "name=local"]),
                  progress=False)
    assert not started
    ray_run = train(load_config("gaca_agent/configs/default.yaml", [
        *base, "name=ray", "cluster.backend=ray", f"cluster.address={cluster[0].address}",
        "cluster.env_cpus=0.5", "cluster.env_resources={envhost: 1}"]), progress=False)

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in (run / "metrics.jsonl").open()]

    assert rows(ray_run) == rows(local)
    assert started == [0, 1, 0, 1]  # the training and held-out collectors' actors


@pytest.mark.slow
def test_the_asynchronous_mode_runs_on_ray_unchanged(tmp_path, tiny_model_path, fresh_accelerate,
                                                     monkeypatch):
    """One step stale through gaca-serve, the env workers Ray actors (a Ray started by the
    run): each iteration sampled by the version the schedule fixes."""
    import ray

    from gaca_agent.cluster.ray_pool import RayPool
    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train
    from test_async import gaca_serve, rows_of, steps_of

    started = []
    start = RayPool._start
    monkeypatch.setattr(RayPool, "_start", lambda pool, w: (started.append(w), start(pool, w)))
    serve = gaca_serve(tiny_model_path)
    base = next(serve)
    try:
        run = train(load_config("gaca_agent/configs/default.yaml", [
            "iterations=3", "eval_every=0", "checkpoint_every=0", "env.groups=2",
            "env.group_size=2", "env.workers=2", "learner.old_logprobs=recompute",
            "learner.tis_cap=2", "warmup.bc_steps=5", "warmup.bc_episodes=2",
            "keep_rollouts=tokens", f"out_dir={tmp_path}", "name=async", "max_staleness=1",
            "model.engine=server", f"server.base_url={base}", "server.model=tiny",
            "server.kind=sglang", "server.weight_transfer=broadcast", "model.max_new_tokens=12",
            "cluster.backend=ray", "cluster.env_cpus=0.5", "cluster.object_store_mb=100"]),
            progress=False)
    finally:
        next(serve, None)
        ray.shutdown()
    assert started  # the env workers were Ray actors
    rows = rows_of(run)
    for it in range(3):
        assert {s["policy_version"] for s in steps_of(run, it)} == {max(0, it - 1)}
        assert rows[it]["async/stale_max"] == min(it, 1) and rows[it]["sync/version"] == it + 1
    assert "backend: ray" in (run / "config.yaml").read_text()  # resumes on Ray too


@pytest.mark.slow
def test_inference_servers_placed_by_ray_share_the_rollouts_and_survive_a_lost_node(
        tmp_path, tiny_model_path, fresh_accelerate, monkeypatch):
    """cluster.servers: 2 gaca-serve processes started by Ray actors on two nodes (a
    custom resource stands for a GPU); both serve episodes; a node removed after the
    first iteration takes its server with it, the other serves on, and a server started
    in its place on a node that joined takes the next weight sync and serves too."""
    import json
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from conftest import once_logged, picks_of
    from gaca_agent.cluster.servers import Fleet
    from gaca_agent.config import load_config
    from gaca_agent.generate.server_group import ServerGroup
    from gaca_agent.training.loop import train

    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 80 << 20, "include_dashboard": False})
    nodes = [made.add_node(num_cpus=1, resources={"gpu_slot": 1}, object_store_memory=80 << 20)
             for _ in range(3)]  # one of them spare
    ray.init(address=made.address, log_to_driver=False)
    fleets, init = [], Fleet.__init__
    monkeypatch.setattr(Fleet, "__init__", lambda f, *a: (fleets.append(f), init(f, *a))[1])
    picked = picks_of(monkeypatch)
    run_dir = tmp_path / "placed"
    gone: list[int] = []
    urls: list[str] = []  # the servers' as started
    removing, settled = threading.Event(), threading.Event()
    pick = ServerGroup._pick  # turns wait while the node goes: the loss is one point in time
    monkeypatch.setattr(ServerGroup, "_pick", lambda group, episode: (
        removing.is_set() and settled.wait(300), pick(group, episode))[1])

    admit = ServerGroup.admit
    monkeypatch.setattr(ServerGroup, "admit", lambda group, i, engine: (
        picked.append("admitted"), admit(group, i, engine))[1])
    ready = Fleet.ready  # the replacement waited for: it joins at the first sync after
    monkeypatch.setattr(Fleet, "ready", lambda fleet, wait_s=0.0: ready(fleet, 180))

    def lose_a_node() -> None:  # "lost" is marked once its server refuses connections
        removing.set()
        try:
            urls.extend(fleets[0].urls)
            second = ray.get(fleets[0].actors[1].node_id.remote())
            made.remove_node(next(n for n in nodes if n.node_id == second))
            gone.append(first_refusing(urls, deadline_s=180))
            picked.append("lost")
        finally:
            settled.set()

    once_logged(run_dir, 0, lose_a_node)
    try:
        train(load_config("gaca_agent/configs/default.yaml", [
            "iterations=3", "eval_every=0", "checkpoint_every=0", "env.groups=2",
            "env.group_size=2", "env.workers=0", "learner.old_logprobs=recompute",
            "learner.lora_r=4", "warmup.bc_steps=5", "warmup.bc_episodes=2",
            f"out_dir={tmp_path}", "name=placed", "model.engine=server", "server.model=tiny",
            "server.retries=0", "model.max_new_tokens=12", "cluster.backend=ray",
            f"cluster.address={made.address}", "cluster.servers=2", "cluster.server_cpus=0.5",
            # env actors small enough that wherever Ray puts them the spare node keeps
            # room for the replacement server
            "cluster.env_cpus=0.2",
            "cluster.server_resources={gpu_slot: 1}", "cluster.server_start_timeout_s=120"]),
            progress=False)
    finally:
        ray.shutdown()
        made.shutdown()
    assert len(fleets) == 1 and len(fleets[0].urls) == 2
    assert gone[0] is not None, "the lost node's server still answered after 180 s"
    assert fleets[0].urls[gone[0]] != urls[gone[0]]  # a new server in its place
    lost, admitted = picked.index("lost"), picked.index("admitted")
    between, survivor = picked[lost + 1:admitted], 1 - gone[0]
    # both served before; once the lost one was gone, at most the 4 live episodes' turns
    # went to it before its failure was known, and then only the other
    assert set(picked[:lost]) == {0, 1} and between.count(gone[0]) <= 4
    assert set(between[-10:]) == {survivor}
    assert set(picked[admitted + 1:]) == {0, 1}  # the replacement serves too
    assert picked.count("admitted") == 1
    rows = {r["iteration"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())}
    assert sorted(rows) == [-1, 0, 1, 2]


def first_refusing(urls: list[str], deadline_s: float) -> int | None:
    """The index of the first of ``urls`` whose port refuses connections, or None."""
    import socket
    import time
    from urllib.parse import urlsplit

    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        for i, url in enumerate(urls):
            where = urlsplit(url)
            try:
                socket.create_connection((where.hostname, where.port), timeout=5).close()
            except OSError:
                return i
        time.sleep(0.1)
    return None


@pytest.mark.skipif(not has_module("torch"), reason="needs torch (gaca-serve)")
def test_a_started_servers_key_is_in_its_environment_not_its_command_line(
        tiny_model_path, tmp_path, monkeypatch):
    """The key made for a run's servers reaches each server by its environment (any user
    of the node can read a command line): gaca-serve then refuses requests without it.
    `gaca-serve` is this environment's, whatever `gaca-serve` the node's PATH finds."""
    import os
    import sys
    import urllib.error
    import urllib.request

    from gaca_agent.cluster.servers import ServerActor

    other = tmp_path / "gaca-serve"  # another install's, first on PATH
    other.write_text("#!/bin/sh\necho another gaca-serve; exit 9\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    actor = ServerActor("gaca-serve {model} --name {name} --host {host} --port {port}",
                        {"model": tiny_model_path, "name": "tiny", "api_key": "k3y-s3cret"},
                        600)
    try:
        assert "k3y-s3cret" not in " ".join(actor.proc.args)
        words = actor.proc.args[actor.proc.args.index("--") + 1:]
        assert words[:3] == [sys.executable, "-m", "gaca_agent.cli.serve"]
        request = urllib.request.Request(actor.url() + "/models")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=60)
        assert err.value.code == 401
        request.add_header("Authorization", "Bearer k3y-s3cret")
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
    finally:
        actor.stop()


def test_a_server_that_exits_or_never_answers_is_one_line_without_its_key(tmp_path):
    """ServerActor (in this process): a server that exits says so with the tail of its
    output and its command with the key masked; one that never answers /health is
    stopped, with its whole group, after cluster.server_start_timeout_s."""
    import sys

    from gaca_agent.cluster.servers import ServerActor

    exits = (f"{sys.executable} -c \"import sys; print('no GPU here', file=sys.stderr); "
             "sys.exit(3)\" --port {port} --api-key {api_key}")
    with pytest.raises(RuntimeError) as err:
        ServerActor(exits, {"api_key": "k3y-s3cret"}, 600)
    said = str(err.value)
    assert "did not become healthy on" in said and said.endswith("no GPU here")
    assert "--api-key ***" in said and "k3y-s3cret" not in said
    silent = tmp_path / "pid"
    hangs = (f"{sys.executable} -c \"import os, time; open('{silent}', 'w').write("
             "str(os.getpid())); time.sleep(600)\"")
    with pytest.raises(RuntimeError, match="did not become healthy"):
        ServerActor(hangs, {}, 3)
    from conftest import gone_within

    assert gone_within([int(silent.read_text())], 60), "the silent server was left running"


def test_a_health_check_of_a_server_that_takes_connections_but_never_answers_ends():
    """A starting server whose port takes connections but never answers (a server stuck
    in its start-up): one health check says "not healthy" after its own deadline, so
    the start's deadline (cluster.server_start_timeout_s) is kept; without one it waits
    forever."""
    import socket
    import threading

    from gaca_agent.cluster.servers import ServerActor

    listener = socket.create_server(("127.0.0.1", 0))  # listens, never accepts or answers
    actor = ServerActor.__new__(ServerActor)  # its check alone, no process started
    actor.host, actor.port, actor.api_key = "127.0.0.1", listener.getsockname()[1], None
    said = []
    check = threading.Thread(target=lambda: said.append(actor._healthy()), daemon=True)
    try:
        check.start()
        check.join(60)
        assert said == [False], "the health check of a silent server did not end"
    finally:
        listener.close()


HEALTH_SERVER = """
import http.server, os, sys
host, port, flag, seen = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if os.path.exists(flag):
    print('told to fail'); sys.exit(3)
open(os.path.join(seen, str(port)), 'w').write(str(os.getpid()))
key = 'Bearer ' + os.environ['GACA_SERVE_API_KEY']
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == '/health' and self.headers.get('Authorization') == key
        self.send_response(200 if ok else 401)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((host, port), Health).serve_forever()
"""


def test_a_fleet_replaces_a_lost_server_says_a_failed_start_and_stops_them_all(tmp_path):
    """Fleet (the run's inference servers, each in a Ray actor; a small /health server
    here, no model): started with the run's key in their environment; a server replaced
    gets a new actor and URL, reported once by ready() (a second replace of the same one
    starts nothing, the others in the same call start), and the old process ends with
    its actor; a replacement that fails is reported with its own words and started again
    by the next replace; close() ends every server and its actor."""
    import sys
    from urllib.parse import urlsplit

    import ray

    from conftest import gone_within, true_within
    from gaca_agent.cluster.servers import Fleet

    script, flag, seen = tmp_path / "health.py", tmp_path / "fail", tmp_path / "seen"
    script.write_text(HEALTH_SERVER)
    seen.mkdir()

    def pid(url):
        return int((seen / str(urlsplit(url).port)).read_text())

    ray.init(address="local", num_cpus=2, object_store_memory=80 << 20,
             include_dashboard=False, log_to_driver=False)
    fleet = None
    try:
        spec = ClusterSection(backend="ray", servers=2, server_cpus=0.25,
                              server_start_timeout_s=120, server_command=(
                                  f"{sys.executable} {script} {{host}} {{port}} {flag} {seen}"))
        fleet = Fleet(spec, {"model": "/m", "name": "tiny"})
        first = list(fleet.urls)
        assert len(set(first)) == 2
        host = ray.util.get_node_ip_address()
        assert all(u.startswith(f"http://{host}:") and u.endswith("/v1") for u in first)
        fleet.replace([0])
        starting = fleet.actors[0]
        fleet.replace([0, 1])  # 0 already being replaced: only 1 is started
        assert fleet.actors[0] is starting and sorted(fleet.starting) == [0, 1]
        assert fleet.ready(0.0) == ({}, {})  # not up yet
        up, failed = fleet.ready(300)
        assert failed == {} and sorted(up) == [0, 1]
        assert [up[0], up[1]] == fleet.urls and not set(fleet.urls) & set(first)
        assert fleet.starting == {} and fleet.ready(0.0) == ({}, {})
        assert gone_within([pid(u) for u in first], 60), "a replaced server was left running"
        first = list(fleet.urls)
        flag.touch()
        fleet.replace([1])
        up, failed = fleet.ready(300)
        assert up == {} and list(failed) == [1]
        assert "did not become healthy" in failed[1] and "told to fail" in failed[1]
        assert fleet.urls[1] == first[1]  # kept until a replacement is up
        flag.unlink()
        fleet.replace([1])
        up, failed = fleet.ready(300)
        assert failed == {} and list(up) == [1] and up[1] not in first
        live = [pid(u) for u in fleet.urls]
        fleet.close()
        assert fleet.actors == []
        assert gone_within(live, 60), "close() left a server running"
        # and their actors, even one whose handle is held elsewhere (`starting` here): the
        # CPUs they held are free
        assert true_within(lambda: ray.available_resources().get("CPU") == 2.0, 120), \
            "close() left an actor holding CPUs"
    finally:
        if fleet is not None:
            fleet.close()
        ray.shutdown()


def test_stalled_env_actors_are_replaced_within_one_deadline_and_only_their_slots_fail():
    """RayPool on a Ray started here (the collect tests' probe env): an actor whose env
    stops answering fails its slot after env.timeout_s and is replaced by a new actor,
    while the other actor's slot plays on; two stalled in one call share one deadline."""
    import os
    from pathlib import Path

    import ray

    from gaca_agent.cluster.ray_pool import RayPool
    from gaca_agent.collect.workers import WorkerFailure

    tests = str(Path(__file__).resolve().parent)
    ray.init(address="local", num_cpus=2, object_store_memory=80 << 20,
             include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 [tests, os.environ.get("PYTHONPATH", "")])}})
    pool = RayPool("collect_probe:gaca-test/Stall-v0", None, 2, 2,
                   ClusterSection(backend="ray", env_cpus=0.5, object_store_mb=80),
                   timeout_s=10)
    try:
        pool.call("reset", [(0, (0, None)), (1, (0, None))])
        before = pool.pids()
        assert len(set(before)) == 2 and os.getpid() not in before
        out = pool.call("step", [(0, "stall"), (1, "finish")])
        assert isinstance(out[0], WorkerFailure) and out[1][1] == 1.0 and out[1][2] is True
        assert pool.restarts == 1
        after = pool.pids()
        assert after[0] != before[0] and after[1] == before[1]
        pool.call("reset", [(0, (0, None)), (1, (0, None))])
        waits = []
        receive = pool._receive
        pool._receive = lambda w, t: (waits.append(t), receive(w, t))[1]
        both = pool.call("step", [(0, "stall"), (1, "stall")])
        assert set(both) == {0, 1} and all(isinstance(f, WorkerFailure) for f in both.values())
        assert 3 < waits[0] <= 10 and waits[1] < 3  # one deadline for the call
        assert pool.restarts == 3
        assert set(pool.nodes()) == {ray.get_runtime_context().get_node_id()}
    finally:
        pool.close()
        ray.shutdown()
    assert pool._actors == [None, None]
