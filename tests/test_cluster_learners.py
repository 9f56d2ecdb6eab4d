"""cluster.learners: learner ranks placed by Ray run the accelerate/FSDP2 code as under
torchrun (the same update, the same run), in rank order by node and device; a lost rank
stops the run in one line and ``--resume`` finishes it exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import has_module
from gaca_agent.cluster.learners import Place, rank_envs, rank_order
from gaca_agent.config import ClusterSection

ROOT = Path(__file__).resolve().parents[1]
needs_ray = pytest.mark.skipif(not has_module("ray"), reason="needs Ray (pip install -e '.[ray]')")
SMALL = ["iterations=2", "eval_every=1", "checkpoint_every=1", "env.groups=3",
         "env.group_size=2", "env.max_live_envs=4", "warmup.bc_steps=40",
         "warmup.bc_episodes=4", "model.max_new_tokens=12", "learner.kl_coef=0.01",
         "learner.micro_batch_size=8", "env.invalid_penalty=-0.1", "env.eval_episodes=5"]


def env_vars():
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": "1"}


def train_command(*args):
    return [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config",
            str(ROOT / "gaca_agent" / "configs" / "default.yaml"), *args]


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["iteration"]: {k: v for k, v in r.items() if not k.startswith("perf/")}
            for r in rows}


def test_gpu_ids_are_strings_in_device_order():
    """Ray reports GPU ids as indices, or as UUIDs and MIG ids on some nodes: kept as
    strings, numeric ones by value (2 before 10), the others after them as named."""
    from gaca_agent.cluster.learners import gpu_ids

    assert gpu_ids([10, "2", 0]) == ("0", "2", "10")
    mig = "MIG-4b1c6c3e-9f0a-5a5e-8d61-2f1f1c0e9a11"
    assert gpu_ids([mig, "GPU-7f3a", "1"]) == ("1", "GPU-7f3a", mig)
    two = [Place("n", "10.0.0.1", ("10",)), Place("n", "10.0.0.1", ("2",))]
    assert rank_order(two) == [1, 0]
    assert rank_envs(two, 1)[0]["CUDA_VISIBLE_DEVICES"] == "2,10"


def test_the_master_port_is_free_and_outside_the_kernels_port_0_range():
    """Rank 0's rendezvous port is drawn below the ports the kernel hands out for a bind to
    port 0: between its choice and torch's bind, a server another process starts (Ray
    starts several) cannot take it (a rank once reached an HTTP server there); a port in
    use is drawn again."""
    import socket

    from gaca_envs.net import ephemeral_range, rendezvous_port

    low = ephemeral_range()[0]
    if low <= 11_000:
        pytest.skip(f"this kernel's port-0 range starts at {low}: no room below it")
    ports = [rendezvous_port() for _ in range(20)]
    assert all(10_000 <= p < low for p in ports)
    with socket.socket() as busy:
        busy.bind(("", ports[0]))
        busy.listen()
        free = next(p for p in ports[1:] if p != ports[0])
        draws = iter([ports[0], ports[0], free])
        assert rendezvous_port(lambda a, b: next(draws)) == free


def test_ranks_follow_nodes_then_devices():
    """Bundles come back in any order; ranks go by node address, node id, GPU id. Each
    node's ranks see that node's GPUs in local-rank order (device LOCAL_RANK is theirs)."""
    places = [Place("n2", "10.0.0.2", ("3",)), Place("n1", "10.0.0.1", ("1",)),
              Place("n2", "10.0.0.2", ("0",)), Place("n1", "10.0.0.1", ("0",))]
    assert rank_order(places) == [3, 1, 2, 0]
    envs = rank_envs(places, 29500)
    assert [envs[i]["RANK"] for i in (3, 1, 2, 0)] == ["0", "1", "2", "3"]
    assert [envs[i]["LOCAL_RANK"] for i in (3, 1, 2, 0)] == ["0", "1", "0", "1"]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.1"}
    assert {e["MASTER_PORT"] for e in envs} == {"29500"}
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} \
        == {"2"}
    assert envs[3]["CUDA_VISIBLE_DEVICES"] == envs[1]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert envs[2]["CUDA_VISIBLE_DEVICES"] == "0,3"
    # no GPUs: no CUDA_VISIBLE_DEVICES; one node's ranks in bundle order; rank 0's node
    # is the master
    cpu = rank_envs([Place("a", "10.0.0.1"), Place("a", "10.0.0.1"), Place("b", "10.0.0.0")], 1)
    assert [e["RANK"] for e in cpu] == ["1", "2", "0"]
    assert {e["MASTER_ADDR"] for e in cpu} == {"10.0.0.0"}
    assert [e["LOCAL_RANK"] for e in cpu] == ["0", "1", "0"]
    assert [e["LOCAL_WORLD_SIZE"] for e in cpu] == ["2", "2", "1"]
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in cpu)


def test_a_ranks_bundle_is_what_the_section_asks():
    from gaca_agent.cluster.learners import bundle

    assert bundle(ClusterSection(backend="ray", learners=2, learner_cpus=4, learner_gpus=1,
                                 learner_resources={"a100": 1})) == {
        "CPU": 4.0, "a100": 1.0, "GPU": 1.0}
    assert bundle(ClusterSection(backend="ray", learners=2)) == {"CPU": 1.0}


def test_learner_ranks_need_ray_and_sane_resources():
    with pytest.raises(ValueError, match="cluster.learners are started by Ray"):
        ClusterSection(learners=2)
    with pytest.raises(ValueError, match="cluster.learners >= 0"):
        ClusterSection(backend="ray", learners=-1)
    with pytest.raises(ValueError, match="learner_gpus >= 0"):
        ClusterSection(backend="ray", learners=1, learner_gpus=-1)
    with pytest.raises(ValueError, match="must ask for something"):
        ClusterSection(backend="ray", learners=2, learner_cpus=0)
    assert ClusterSection(backend="ray", learners=2, learner_cpus=0, learner_gpus=1).learners
    assert ClusterSection(backend="ray", learners=2).learner_strategy == "PACK"


def test_a_rank_joins_its_launchers_cluster(monkeypatch):
    """A rank Ray placed joins the launcher's Ray (the variable the rank's actor sets),
    not a new one on its node; a run's own cluster.address comes first."""
    import types

    from gaca_agent.cluster import ray_pool
    from gaca_agent.cluster.ray_pool import ADDRESS_VAR

    joined = []
    constants = types.SimpleNamespace(ENABLE_RAY_CLUSTER=True)
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: joined.append(
        {**kw, "loopback": not constants.ENABLE_RAY_CLUSTER}))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray._private",
                        types.SimpleNamespace(ray_constants=constants))
    checked = []
    monkeypatch.setattr(ray_pool, "check_reachable", checked.append)
    monkeypatch.setenv(ADDRESS_VAR, "10.0.0.1:6379")
    ray_pool.connect(ClusterSection(backend="ray"))
    ray_pool.connect(ClusterSection(backend="ray", address="ray://head:10001"), True)
    monkeypatch.setenv(ADDRESS_VAR, "127.0.0.1:6379")  # a launcher's Ray on loopback
    ray_pool.connect(ClusterSection(backend="ray"))
    for loopback in ("ray://127.0.0.1:10001", "[::1]:6379"):  # a client's, IPv6's
        ray_pool.connect(ClusterSection(backend="ray", address=loopback))
    monkeypatch.delenv(ADDRESS_VAR)
    ray_pool.connect(ClusterSection(backend="ray", object_store_mb=100))
    assert joined == [
        {"address": "10.0.0.1:6379", "log_to_driver": False, "loopback": False},
        {"address": "ray://head:10001", "log_to_driver": True, "loopback": False},
        # joined as loopback: Ray would rewrite 127.0.0.1 to the default route's address
        {"address": "127.0.0.1:6379", "log_to_driver": False, "loopback": True},
        {"address": "ray://127.0.0.1:10001", "log_to_driver": False, "loopback": True},
        {"address": "[::1]:6379", "log_to_driver": False, "loopback": True},
        # a Ray started here: its object store as asked, no dashboard, quiet actors, on
        # loopback (and Ray's own flag as it was, after)
        {"address": "local", "object_store_memory": 100 << 20, "include_dashboard": False,
         "log_to_driver": False, "loopback": True}]
    assert constants.ENABLE_RAY_CLUSTER
    assert checked == ["10.0.0.1:6379", "ray://head:10001", "127.0.0.1:6379",
                       "ray://127.0.0.1:10001", "[::1]:6379"]  # each tried first
    fake.is_initialized = lambda: True  # once per process
    ray_pool.connect(ClusterSection(backend="ray"))
    assert len(joined) == 6


def test_a_cluster_address_that_nothing_holds_fails_in_seconds_in_one_line(monkeypatch):
    """ray.init waits forever for an address nothing listens on: the address is tried
    first (and by --dry-run), and a dead one is one line naming it; a config asking for
    less object store than Ray's 75 MB, or Ray when it is missing, is refused first."""
    import importlib.util
    import socket

    from gaca_agent.cluster.ray_pool import check_reachable
    from gaca_agent.config.checks import InputError, check_ray

    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        port = dead.getsockname()[1]  # bound, not listening: refused
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"cluster.address 127.0.0.1:{port}: no Ray "
                                              "answers there within 2 s"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2)
    assert time.monotonic() - t0 < 30
    with pytest.raises(InputError, match="no Ray answers there"):
        check_ray(f"ray://127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match="is not HOST:PORT"):
        check_reachable("head-node")
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        check_reachable(f"ray://127.0.0.1:{live.getsockname()[1]}")
        check_reachable("auto")  # Ray's own lookup
    with pytest.raises(ConnectionError, match="is not HOST:PORT"):
        check_reachable(":6379")  # no host
    with pytest.raises(ConnectionError, match="is not HOST:PORT"):
        check_reachable("head-node:ray")  # no port
    try:
        live6 = socket.socket(socket.AF_INET6)
        live6.bind(("::1", 0))
    except OSError:
        live6 = None  # no IPv6 loopback here
    if live6 is not None:
        with live6:
            live6.listen()
            check_reachable(f"[::1]:{live6.getsockname()[1]}")  # an IPv6 head
    with pytest.raises(ValueError, match="object_store_mb >= 75"):
        ClusterSection(object_store_mb=74)
    assert ClusterSection(object_store_mb=75).object_store_mb == 75
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(InputError, match=r"cluster.backend: ray needs Ray: pip install"):
        check_ray("")


def test_a_launch_refuses_an_existing_run_before_placing_anything(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("")
    run = subprocess.run(train_command(f"out_dir={tmp_path}", "name=taken",
                                       "cluster.backend=ray", "cluster.learners=2"),
                         cwd=tmp_path, env=env_vars(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        f"gaca-train: error: {tmp_path / 'taken'} already holds a run: --resume it or "
        f"choose another name")
    assert "Ray" not in run.stderr


@needs_ray
@pytest.mark.slow
def test_two_ranks_placed_by_ray_make_torchruns_fsdp2_update(tmp_path, tiny_model_path):
    """tests/dist_probe.py (FSDP2 in bf16, unequal shares, generation inside the
    rollout context) as two ranks Ray placed, and under torchrun: the same parameters
    and metrics, bit for bit."""
    import ray

    from gaca_agent.cluster.learners import run_ranks

    probe = [str(ROOT / "tests" / "dist_probe.py"), tiny_model_path]
    options = json.dumps({"fsdp": True, "bf16": True})
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                               "--nproc_per_node", "2", *probe, str(tmp_path / "t"), options],
                              cwd=tmp_path, env=env_vars(), capture_output=True, text=True,
                              timeout=300)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    placed = []
    try:
        run_ranks(ClusterSection(backend="ray", learners=2, learner_cpus=0.5),
                  [*probe, str(tmp_path / "r"), options], cwd=str(tmp_path),
                  on_placed=placed.append)
    finally:
        ray.shutdown()
    assert [p.split(":")[0] for p in placed] == ["learner rank 0", "learner rank 1"]
    for rank in (0, 1):
        by_ray = json.loads((tmp_path / f"r.rank{rank}.json").read_text())
        by_torchrun = json.loads((tmp_path / f"t.rank{rank}.json").read_text())
        assert by_ray == by_torchrun and by_ray["sharded"] is True


@needs_ray
@pytest.mark.slow
def test_gaca_train_with_two_ray_ranks_logs_torchruns_metrics(tmp_path):
    """One machine, a Ray the run starts: two learner ranks, their env workers Ray actors
    in the same Ray; every metric row equals two torchrun ranks' with local workers."""
    ray_run = subprocess.run(train_command(
        f"out_dir={tmp_path}", "name=ray", *SMALL, "cluster.backend=ray", "cluster.learners=2",
        "cluster.learner_cpus=0.5", "cluster.env_cpus=0.25"),
        cwd=tmp_path, env=env_vars(), capture_output=True, text=True, timeout=600)
    assert ray_run.returncode == 0, ray_run.stderr[-3000:]
    assert f"run directory: {tmp_path / 'ray'}" in ray_run.stdout.splitlines()  # the launcher's
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                               "--nproc_per_node", "2", *train_command(
                                   f"out_dir={tmp_path}", "name=torchrun", *SMALL)[1:]],
                              cwd=tmp_path, env=env_vars(), capture_output=True, text=True,
                              timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    assert sorted(metrics(tmp_path / "ray")) == [-1, 0, 1]
    assert metrics(tmp_path / "ray") == metrics(tmp_path / "torchrun")
    digests = json.loads((tmp_path / "ray" / "final" / "rank_digests.json").read_text())
    assert len(digests["digests"]) == 2 and digests["in_sync"]


@needs_ray
@pytest.mark.slow
def test_a_lost_learner_rank_stops_the_run_in_one_line_and_resume_is_exact(tmp_path):
    """Three nodes with room for one rank each (and its env actors): a run's rank 1 node
    is removed after its first checkpoint; the launcher stops every rank and says so in one line naming the
    checkpoint; --resume (on the nodes left) ends with the uninterrupted run's metrics."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 << 20, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=2, resources={"trainer": 1},
                              object_store_memory=80 << 20) for _ in range(3)]
    run = [*SMALL, "iterations=6", "eval_every=0", "cluster.backend=ray",
           f"cluster.address={cluster.address}", "cluster.learners=2",
           "cluster.learner_resources={trainer: 1}", "cluster.env_cpus=0.25"]
    try:
        whole = subprocess.run(train_command(f"out_dir={tmp_path}", "name=whole", *run),
                               cwd=tmp_path, env=env_vars(), capture_output=True, text=True,
                               timeout=600)
        assert whole.returncode == 0, whole.stderr[-3000:]
        proc = subprocess.Popen(train_command(f"out_dir={tmp_path}", "name=cut", *run),
                                cwd=tmp_path, env=env_vars(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        latest = tmp_path / "cut" / "checkpoints" / "latest"
        deadline = time.monotonic() + 300
        while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        placed = [x for x in lines if x.startswith("learner rank 1: node")]
        assert placed, lines
        node = next(n for n in nodes if n.node_id in placed[0])
        cluster.remove_node(node)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, err[-3000:]
        stops = [x for x in err.splitlines() if x.startswith("gaca-train: error:")]
        assert len(stops) == 1, err[-3000:]
        line = stops[0]
        kept = latest.read_text().strip()
        assert line.startswith("gaca-train: error: the run stopped: RankLost: learner rank 1 "
                               "on "), line
        assert f"the latest checkpoint, {kept}, is intact: gaca-train --resume " \
               f"{tmp_path / 'cut'} continues from it" in line, line
        assert sorted(metrics(tmp_path / "cut")) != sorted(metrics(tmp_path / "whole"))
        resumed = subprocess.run([*train_command()[:4], "--resume", str(tmp_path / "cut")],
                                 cwd=tmp_path, env=env_vars(), capture_output=True,
                                 text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        cut, whole_rows = metrics(tmp_path / "cut"), metrics(tmp_path / "whole")
        assert sorted(cut) == sorted(whole_rows) == [-1, 0, 1, 2, 3, 4, 5]
        for it in whole_rows:
            for key, value in whole_rows[it].items():
                assert cut[it][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (it, key)
    finally:
        cluster.shutdown()


@pytest.mark.skipif(not has_module("ray"), reason="needs Ray (pip install -e '.[ray]')")
def test_a_rank_runs_its_command_with_its_variables_its_config_and_its_exit_code(tmp_path):
    """LearnerRank (in this process, on a Ray started here): where it runs, a free port,
    and its run(): the command with ``{config}`` a file holding the config, the rank's
    variables plus the launcher's Ray address, and the command's exit code."""
    import ray

    from gaca_agent.cluster.learners import LearnerRank
    from gaca_agent.cluster.ray_pool import ADDRESS_VAR, connect

    connect(ClusterSection(backend="ray", object_store_mb=80))
    try:
        rank = LearnerRank()
        place = rank.where()
        assert place.node_id == ray.get_runtime_context().get_node_id()
        assert place.ip == "127.0.0.1" and place.gpus == ()
        assert 0 < rank.port() < 65536
        seen = tmp_path / "seen.json"
        code = rank.run(["-c", "import json, os, sys; json.dump({'rank': os.environ['RANK'], "
                         f"'ray': os.environ['{ADDRESS_VAR}'], 'cwd': os.getcwd(), "
                         "'config': open(sys.argv[1]).read()}, open('seen.json', 'w')); "
                         "sys.exit(4)", "{config}"], {"RANK": "1"}, str(tmp_path),
                        config="iterations: 3\n")
        address = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    assert code == 4
    assert json.loads(seen.read_text()) == {"rank": "1", "ray": address, "cwd": str(tmp_path),
                                            "config": "iterations: 3\n"}


RANK_SEES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "GACA_PASSED", "UNPASSED_VAR")


def rank_script(acting: int, then: str) -> str:
    """A rank's ``python -c`` program: it writes its pid to RANK.pid; rank ``acting``
    waits for the other rank's pid file and runs ``then``; then every rank sleeps for 10
    minutes (until it is stopped)."""
    body = "".join(f"    {line}\n" for line in then.splitlines())
    return ("import os, signal, sys, time\n"
            "open(os.environ['RANK'] + '.pid', 'w').write(str(os.getpid()))\n"
            f"if os.environ['RANK'] == '{acting}':\n"
            f"    while not os.path.exists('{1 - acting}.pid'): time.sleep(0.1)\n"
            f"{body}time.sleep(600)")


@needs_ray
def test_ranks_get_torchruns_variables_and_a_failed_or_lost_rank_stops_the_run(
        tmp_path, monkeypatch):
    """run_ranks on a Ray started here (two GPUs as Ray counts them, none real), with
    commands in place of gaca-train: each rank's process gets torchrun's variables (rank
    0's address and port, the node's GPUs in local-rank order) and the launcher's GACA_
    variables, not its other ones; a line per rank says where it runs. A rank that
    exits 3 stops the run in one line naming it, and the other rank's process ends; a
    rank whose actor is lost is said as such, and its process ends too."""
    import ray

    from conftest import gone_within
    from gaca_agent.cluster.learners import RankLost, run_ranks
    from gaca_agent.cluster.ray_pool import on_loopback

    cluster = ClusterSection(backend="ray", learners=2, learner_cpus=0.5, learner_gpus=1,
                             learner_resources={"fast_disk": 1}, learner_start_timeout_s=600)
    with on_loopback(True):  # as a run's own Ray
        ray.init(address="local", num_cpus=2, num_gpus=2, resources={"fast_disk": 2},
                 object_store_memory=80 << 20, include_dashboard=False, log_to_driver=False)
    try:
        monkeypatch.setenv("GACA_PASSED", "yes")  # after the Ray's start: not its nodes'
        monkeypatch.setenv("UNPASSED_VAR", "no")
        lines = []
        run_ranks(cluster, ["-c", "import json, os, sys; json.dump({k: os.environ.get(k) "
                            f"for k in {RANK_SEES!r}}} | {{'config': open(sys.argv[1]).read()}}, "
                            "open(os.environ['RANK'] + '.json', 'w'))", "{config}"],
                  cwd=str(tmp_path), config="iterations: 2\n", on_placed=lines.append)
        seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
        assert [env.pop("config") for env in seen] == ["iterations: 2\n"] * 2
        port = seen[0]["MASTER_PORT"]
        assert port.isdigit() and seen[1]["MASTER_PORT"] == port
        for rank, env in enumerate(seen):
            assert env == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": port, "CUDA_VISIBLE_DEVICES": "0,1",
                           "GACA_PASSED": "yes", "UNPASSED_VAR": None}
        node = ray.get_runtime_context().get_node_id()
        assert lines == [f"learner rank {r}: node 127.0.0.1 ({node}), GPUs ['{r}']"
                         for r in (0, 1)]

        # rank 1 exits 3 once rank 0's process is up; rank 0 would sleep for 10 minutes
        fails = rank_script(1, "sys.exit(3)")
        with pytest.raises(RankLost, match=r"^learner rank 1 on 127\.0\.0\.1 exited with "
                                           r"code 3 \(its own error is above\)$"):
            run_ranks(cluster, ["-c", fails], cwd=str(tmp_path), on_placed=lambda _: None)
        assert gone_within([int((tmp_path / "0.pid").read_text())], 60), \
            "the other rank's process outlived the run"

        # rank 0 kills its own actor (the reaper's parent's parent) once rank 1 is up
        for f in tmp_path.glob("*.pid"):
            f.unlink()
        lost = rank_script(0, "stat = lambda p: open(f'/proc/{p}/stat').read().rsplit(')', 1)[1]\n"
                              "actor = int(stat(int(stat(os.getppid()).split()[1])).split()[1])\n"
                              "os.kill(actor, signal.SIGKILL)")
        with pytest.raises(RankLost, match=r"^learner rank 0 on 127\.0\.0\.1 was lost with "
                                           r"its actor, process or node \(.*[Aa]ctor.*\)$"):
            run_ranks(cluster, ["-c", lost], cwd=str(tmp_path), on_placed=lambda _: None)
        pids = [int((tmp_path / f"{r}.pid").read_text()) for r in (0, 1)]
        assert gone_within(pids, 60), "a rank's process outlived its lost actor"
    finally:
        ray.shutdown()


@needs_ray
def test_ranks_the_cluster_cannot_hold_stop_the_run_in_one_line(tmp_path):
    """run_ranks on a Ray of 2 CPUs started here: ranks asking for more than the cluster
    holds are refused at once, before a placement group waits; ranks whose strategy the
    cluster cannot meet (STRICT_SPREAD on one node) end after learner_start_timeout_s in
    one line naming the strategy; either way nothing is left reserved and no rank ran."""
    import ray

    from gaca_agent.cluster.learners import RankLost, run_ranks
    from gaca_agent.cluster.ray_pool import on_loopback

    with on_loopback(True):
        ray.init(address="local", num_cpus=2, object_store_memory=80 << 20,
                 include_dashboard=False, log_to_driver=False)
    ran = ["-c", f"open({str(tmp_path / 'ran')!r}, 'w')"]
    try:
        big = ClusterSection(backend="ray", learners=2, learner_cpus=1.5,
                             learner_start_timeout_s=30)
        with pytest.raises(RankLost, match=r"^cannot place 2 learner ranks of \{'CPU': 1\.5\}: "
                                           r"2 of them ask for 3 CPU in all; the cluster has 2$"):
            run_ranks(big, ran, cwd=str(tmp_path), on_placed=lambda _: None)
        spread = ClusterSection(backend="ray", learners=2, learner_cpus=0.5,
                                learner_strategy="STRICT_SPREAD", learner_start_timeout_s=5)
        with pytest.raises(RankLost, match=r"^cannot place 2 learner ranks of \{'CPU': 0\.5\} "
                                           r"\(STRICT_SPREAD\) within 5 s: the cluster has "
                                           r"\{.*\} free$"):
            run_ranks(spread, ran, cwd=str(tmp_path), on_placed=lambda _: None)
        assert not (tmp_path / "ran").exists()
        tables = ray.util.placement_group_table().values()
        assert all(t["state"] == "REMOVED" for t in tables)
    finally:
        ray.shutdown()
