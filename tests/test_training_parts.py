"""The training loop's parts, in process: a short run logs exactly what its stored
rollouts hold; each iteration's task groups, rank-global ids and reduced metrics; the
weight sync after each update (the files it keeps, the names it loads, both probes, the
error it stops with)."""

from __future__ import annotations

import gzip
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from gaca_agent.collect.collector import Collector
from gaca_agent.config import EnvSection, load_config
from gaca_agent.policies import make_policy
from gaca_agent.training.ranks import (estimate, globalize, iteration_tasks, rollout_metrics,
                                       rollout_sums)

pytest.importorskip("torch")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "gaca_agent" / "configs" / "default.yaml"


def test_a_short_run_logs_what_its_rollouts_hold(tmp_path, fresh_accelerate):
    from gaca_agent.training.loop import train

    cfg = load_config(str(DEFAULT), [
        f"out_dir={tmp_path}", "name=short", "iterations=2", "eval_every=3",
        "checkpoint_every=0", "keep_rollouts=tokens", "env.groups=3", "env.group_size=2",
        "env.max_live_envs=6", "env.eval_episodes=6", "env.invalid_penalty=-0.1",
        "warmup.bc_steps=10", "warmup.bc_episodes=4", "model.max_new_tokens=12",
        "learner.micro_batch_size=16", "learner.mini_batches=1"])
    run = train(cfg, progress=False)
    rows = {r["iteration"]: r for r in map(json.loads, (run / "metrics.jsonl").open())}
    assert sorted(rows) == [-1, 0, 1]
    assert "eval/success" in rows[-1] and "eval/success" in rows[1]
    assert "eval/success" not in rows[0]  # every 3rd iteration, and the last
    for it in (0, 1):
        episodes = [json.loads(x) for x in gzip.open(
            run / "rollouts" / f"iter-{it:05d}.rank0.jsonl.gz", "rt")]
        assert len(episodes) == 6
        r = rows[it]
        assert r["rollout/success"] == pytest.approx(np.mean([e["won"] for e in episodes]))
        assert r["rollout/length"] == pytest.approx(np.mean([e["steps"] for e in episodes]))
        assert r["rollout/return"] == pytest.approx(np.mean([e["reward"] for e in episodes]))
        assert r["rollout/failed"] == 0.0
        steps = [s for e in episodes for s in e["trajectory"]]
        assert r["rollout/format_invalid"] == pytest.approx(
            np.mean([not s["format_valid"] for s in steps]))
        assert r["train/tokens"] == sum(len(s["response_ids"]) for s in steps)
        assert all("advantage" in s and "weight" in s for s in steps)
        tasks = iteration_tasks(cfg, it, 48)  # the train split's 48 tasks
        assert [(e["task_id"], e["seed"]) for e in episodes[::2]] == tasks
        assert [(e["group"], e["traj"]) for e in episodes] == [(g, 2 * g + i)
                                                                for g in range(3)
                                                                for i in range(2)]
    final = json.loads((run / "final_eval" / "results.json").read_text())
    assert final["n"] == 6  # the last iteration's held-out episodes, played again
    assert final["success_rate"] == pytest.approx(rows[1]["eval/success"])
    played = [json.loads(x) for x in (run / "final_eval" / "episodes.jsonl").open()]
    assert [e["index"] for e in played] == list(range(6))  # as gaca-eval writes them
    meta = json.loads((run / "final_eval" / "config.json").read_text())
    assert (meta["policy"], meta["env"], meta["env_kwargs"]) == \
        ("trained", cfg.env.id, dict(cfg.env.eval_kwargs))
    digests = json.loads((run / "final" / "rank_digests.json").read_text())
    assert digests["in_sync"] and all(len(d) == 16 for d in digests["digests"])
    for it in (0, 1):
        r = rows[it]
        assert r["perf/tokens_per_s"] == pytest.approx(r["train/tokens"] / r["perf/update_s"],
                                                       rel=1e-6)
    report = [json.loads(x) for x in (run / "train_episodes.jsonl").open()]
    assert [e["task_id"] for e in report[::2]] == [t for t, _ in iteration_tasks(cfg, 1, 48)]


def test_iteration_tasks_are_the_runs_own_draw():
    cfg = load_config(None, ["env.groups=6", "seed=3"])
    a = iteration_tasks(cfg, 4, 48)
    assert a == iteration_tasks(cfg, 4, 48) and len(a) == 6
    assert a != iteration_tasks(cfg, 5, 48)
    assert a != iteration_tasks(load_config(None, ["env.groups=6", "seed=4"]), 4, 48)
    assert len({t for t, _ in a}) == 6 and all(0 <= t < 48 for t, _ in a)  # no repeats
    assert all(0 <= s < 2**31 - 1 for _, s in a)
    few = iteration_tasks(cfg, 4, 2)  # more groups than tasks: tasks repeat
    assert {t for t, _ in few} <= {0, 1} and len(few) == 6
    unnumbered = iteration_tasks(cfg, 4, None)
    assert [t for t, _ in unnumbered] == list(range(6))
    assert len({s for _, s in unnumbered}) == 6


def collected(tasks, group_size, policy="random", **env):
    collector = Collector(EnvSection(id="gaca/Diag-Slippery-v0", kwargs={"split": "test"},
                                     max_live_envs=4, **env))
    try:
        return collector.run(make_policy(policy, seed=1), tasks, group_size)
    finally:
        collector.close()


def test_a_ranks_ids_become_the_iterations_ids():
    rollout = collected([(0, 5), (1, 6)], 2)
    globalize(rollout, [1, 3], 2)  # this rank played the iteration's groups 1 and 3
    assert [(e.group, e.traj) for e in rollout.episodes] == [(1, 2), (1, 3), (3, 6), (3, 7)]
    table = rollout.table
    for e in rollout.episodes:
        assert set(table["group"][list(e.rows)]) == {e.group}
        assert set(table["traj"][list(e.rows)]) == {e.traj}


def test_rollout_metrics_count_finished_episodes():
    rollout = collected([(0, 5), (1, 6), (2, 7)], 2, invalid_penalty=-0.1)
    eps = rollout.episodes
    eps[0].score = 0.25  # a partial score (WebShop's), apart from success
    eps[1].failed = True
    rollout.table.columns["failed"][list(eps[1].rows)] = True
    sums = rollout_sums(rollout)
    done = [e for i, e in enumerate(eps) if i != 1]
    assert sums["episodes"] == 5 and sums["failed"] == 1
    assert sums["won"] == sum(e.won for e in done)
    assert sums["steps"] == sum(e.length for e in done)
    m = rollout_metrics(sums)
    assert m["rollout/success"] == pytest.approx(np.mean([e.won for e in done]))
    assert m["rollout/return"] == pytest.approx(np.mean([e.total_reward for e in done]))
    assert m["rollout/length"] == pytest.approx(np.mean([e.length for e in done]))
    assert m["rollout/score"] == pytest.approx(np.mean([e.score for e in done]))
    assert m["rollout/failed"] == 1.0 and m["rollout/format_invalid"] == 0.0
    held = rollout_metrics(sums, "eval")
    assert set(held) == {"eval/success", "eval/score", "eval/length", "eval/format_invalid"}
    empty = rollout_metrics({k: 0.0 for k in sums})
    assert empty["rollout/success"] == 0.0 and empty["rollout/format_invalid"] == 0.0


@pytest.mark.parametrize("anchor,similarity", [("state", None), ("observation", None),
                                                ("state", 0.5)])
def test_estimate_on_one_rank_is_the_registry_on_the_whole_table(anchor, similarity,
                                                                 fresh_accelerate):
    from accelerate import Accelerator

    from gaca_agent.advantages import compute
    from gaca_agent.steps import step_batch

    rollout = collected([(0, 5), (1, 6)], 4)
    table = rollout.training_table()
    cfg = load_config(None, ["algo.estimator=gigpo", f"algo.anchor={anchor}"])
    if similarity is not None:  # GiGPO's similarity grouping reads the observation texts
        cfg.algo.params["similarity"] = similarity
    adv, diag, weight, kept = estimate(Accelerator(cpu=True), cfg, table)
    scalars = table.scalars(with_observation=similarity is not None, anchor=anchor)
    expected, _, rows = compute("gigpo", step_batch(scalars), details=True, **cfg.algo.params)
    assert np.array_equal(adv, expected) and np.array_equal(weight, rows["weight"])
    assert len(adv) == len(table) and diag
    assert kept.mask.all() and kept.total == len(table)  # no filter unless asked


class RecordingLearner:
    def __init__(self):
        self.calls = []

    def update(self, table, adv):
        self.calls.append((np.asarray(table["group"]).copy(), np.asarray(adv).copy()))
        return {"train/tokens": 1.0, "train/opt_steps": 1.0}


@pytest.mark.parametrize("filtered", [False, True])
def test_the_group_filter_trains_only_on_groups_whose_episodes_returned_differently(
        filtered, fresh_accelerate):
    from accelerate import Accelerator

    from gaca_agent.training.ranks import train_on

    table = collected([(0, 5), (1, 6)], 4).training_table()
    group, traj = np.asarray(table["group"]), np.asarray(table["traj"])
    reward = np.zeros(len(table))
    reward[np.flatnonzero(traj == traj[group == 0][0])[-1]] = 1.0  # one of group 0's wins
    table = table.with_columns(reward=reward)
    cfg = load_config(None, ["algo.estimator=gigpo", f"algo.filter_groups={filtered}"])
    adv, _, _, kept = estimate(Accelerator(cpu=True), cfg, table)
    learner = RecordingLearner()
    metrics = train_on(learner, table, adv, kept)
    (groups, trained_adv), = learner.calls
    expected = group == 0 if filtered else np.ones(len(table), dtype=bool)
    assert np.array_equal(groups, group[expected]) and np.array_equal(trained_adv, adv[expected])
    assert metrics["train/filtered_rows_frac"] == pytest.approx(1 - expected.mean())

    # every group alike: no update at all (Adam's momentum would move the weights)
    flat = table.with_columns(reward=np.zeros(len(table)))
    adv, _, _, kept = estimate(Accelerator(cpu=True), cfg, flat)
    metrics = train_on(learner, flat, adv, kept)
    assert len(learner.calls) == (1 if filtered else 2)
    if filtered:
        assert metrics["train/opt_steps"] == 0 and metrics["train/filtered_rows_frac"] == 1.0


# ------------------------------------------------------------------ the weight sync
class FakeLearner:
    """What WeightSync uses of the learner: saves, the score, one process."""

    def __init__(self, lora: bool, scores, temperature: float = 1.0):
        from types import SimpleNamespace

        from gaca_agent.learner.config import LearnerConfig

        # the rollouts' temperature, as gaca-train's config gives it
        self.config = LearnerConfig(lora_r=4 if lora else 0, temperature=temperature)
        self.accelerator = SimpleNamespace(is_main_process=True, num_processes=1,
                                           wait_for_everyone=lambda: None)
        self.scores, self.saved = scores, []

    def save_adapter(self, path):
        Path(path).mkdir(parents=True)
        self.saved.append(("adapter", Path(path).name))

    def save_weights(self, path, dtype):
        Path(path).mkdir(parents=True)
        self.saved.append((dtype, Path(path).name))

    def rollout_context(self):
        return nullcontext()

    def score(self, prompt, completion, temperature):
        return np.asarray(self.scores[temperature])


class FakeServer:
    """A server engine that records the syncs and answers the probe with given log-probs;
    ``seeded``: the second probe answer repeats the first."""

    def __init__(self, kind, served, seeded=True, fail=None, base_url="http://fake/v1"):
        self.kind, self.served, self.seeded, self.fail = kind, served, seeded, fail
        self.base_url = base_url
        self.adapter = self.weight_version = None
        self.calls, self.probes = [], []

    @property
    def members(self):
        return [self]

    def lose(self, engine, err):
        return False  # one server: a sync cannot go on without it

    def twin(self, base_url):  # a client of a server started in a lost one's place
        return FakeServer(self.kind, self.served, self.seeded, base_url=base_url)

    def close(self):
        self.closed = True

    def _failing(self):
        if self.fail:
            raise self.fail if isinstance(self.fail, Exception) else RuntimeError(self.fail)

    def load_adapter(self, name, path, version=None):
        self._failing()
        self.calls.append(("adapter", name, path, version))
        self.adapter = name
        if self.kind == "sglang":
            self.weight_version = name

    def update_weights_from_disk(self, path, label, version=None):
        self._failing()
        self.calls.append(("disk", label, path, version))
        self.weight_version = label

    def complete(self, messages, tokens, temperature, key=None):
        from gaca_agent.generate.engines import Completion

        self._failing()
        self.probes.append(temperature)
        again = len(self.probes) % 2 == 0
        ids = [9, 9, 9] if again and not self.seeded else [7, 8, 9]
        return Completion([1], ids, list(self.served[temperature]), "x", "stop")


def weight_sync(tmp_path, lora, kind="vllm", temperatures=(1.0, 0.4), served=None,
                scores=None, **server):
    from types import SimpleNamespace

    from gaca_agent.training.sync import WeightSync

    scores = scores or {1.0: [-1.0, -2.0, -3.0], 0.4: [-0.5, -0.5, -0.5]}
    learner = FakeLearner(lora, scores, temperatures[0])
    engine = FakeServer(kind, served or scores, **server)
    section = SimpleNamespace(sync_dtype="bfloat16", probe_tokens=3, probe_tolerance=0.05,
                              weight_transfer="disk")
    return WeightSync(learner, engine, tmp_path, "run", section, *temperatures), learner, engine


def test_lora_sync_loads_each_version_under_its_own_name_and_keeps_two(tmp_path):
    sync, learner, engine = weight_sync(tmp_path, lora=True)
    for version in (1, 2, 3):
        metrics = sync(version)
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v2", "v3"]
    names = [name for _, name, _, _ in engine.calls]
    assert names == [f"{sync.prefix}-v{v}" for v in (1, 2, 3)] and sync.prefix.startswith("run-")
    assert [v for *_, v in engine.calls] == [1, 2, 3]
    assert engine.calls[-1][2] == str((tmp_path / "adapters" / "v3").resolve())
    assert engine.adapter == names[-1] and engine.weight_version is None  # vLLM: the name
    assert learner.saved == [("adapter", f"v{v}") for v in (1, 2, 3)]
    assert metrics["sync/version"] == 3.0 and metrics["sync/seconds"] >= 0
    assert engine.probes == [1.0, 1.0, 0.4, 0.4] * 3  # both temperatures, every sync
    assert metrics["probe/mean_gap"] == 0.0 and metrics["probe_eval/tokens"] == 3.0
    sglang, _, engine2 = weight_sync(tmp_path / "s", lora=True, kind="sglang")
    sglang(1)
    assert engine2.weight_version == f"{sglang.prefix}-v1"  # SGLang: checked by version


def test_full_weight_sync_labels_the_weights_it_loaded(tmp_path):
    sync, learner, engine = weight_sync(tmp_path, lora=False, temperatures=(1.0, 0.0))
    sync(0)
    sync(1)
    assert learner.saved == [("bfloat16", "v0"), ("bfloat16", "v1")]
    assert engine.calls[-1] == ("disk", f"{sync.prefix}-v1",
                                str((tmp_path / "weights" / "v1").resolve()), 1)
    assert engine.weight_version == f"{sync.prefix}-v1"
    assert engine.probes == [1.0, 1.0] * 2  # greedy held-out decoding is not probed
    same, _, engine2 = weight_sync(tmp_path / "same", lora=False, temperatures=(0.7, 0.7),
                                   scores={0.7: [-1.0], 1.0: [-1.2]})
    assert set(same(1)) >= {"probe/mean_gap"} and engine2.probes == [0.7, 0.7]
    greedy, _, engine3 = weight_sync(tmp_path / "greedy", lora=False, temperatures=(0.0, 0.4))
    assert "probe/mean_gap" not in greedy(1) and engine3.probes == [0.4, 0.4]


def test_a_failed_load_or_probe_stops_with_the_version_and_reason(tmp_path, capsys):
    from gaca_agent.generate.probe import ProbeMismatch
    from gaca_agent.generate.server_engine import WeightSyncError

    sync, _, _ = weight_sync(tmp_path / "a", lora=True, fail="disk quota")
    with pytest.raises(WeightSyncError, match="weight sync of version 2 failed: "
                                              "RuntimeError: disk quota"):
        sync(2)
    off = {1.0: [-1.0, -2.0, -3.0], 0.4: [-0.5, -0.5, -0.9]}  # held-out answers differ
    sync, _, engine = weight_sync(tmp_path / "b", lora=True, served=off)
    with pytest.raises(ProbeMismatch, match="after the weight sync of version 1.*0.1333"):
        sync(1)
    sync, _, _ = weight_sync(tmp_path / "c", lora=True, seeded=False)
    sync(1)
    sync(2)
    warned = capsys.readouterr().out
    assert warned.count("ignores the request seed") == 1
    assert sync(3)["probe/seed_honoured"] == 0.0


def test_a_lost_server_is_replaced_and_joins_at_a_sync_with_its_weights(tmp_path, capsys):
    """With the servers Ray started (a fleet), a server found lost is started again; the
    new one takes the next sync's weights and probe before it is admitted in its place;
    one that did not start, or does not take the weights, is said and left out."""
    from gaca_agent.generate.http import ServerUnreachable
    from gaca_agent.generate.server_group import ServerGroup

    class Fleet:
        def __init__(self, answers):
            self.answers, self.replaced = list(answers), []

        def replace(self, lost):
            self.replaced.append(list(lost))

        def ready(self, wait_s=0.0):
            return self.answers.pop(0)

    sync, _, a = weight_sync(tmp_path, lora=True)
    b = FakeServer("vllm", a.served, base_url="http://other/v1")
    sync.engine = group = ServerGroup([a, b])
    sync.fleet = fleet = Fleet([({}, {}), ({}, {}), ({}, {1: "RuntimeError: no node"}),
                                ({1: "http://new/v1"}, {}), ({}, {}),
                                ({1: "http://bad/v1"}, {})])
    b.fail = ServerUnreachable("http://other/v1: connection refused")
    sync(1)  # b found gone at this sync: dropped
    assert fleet.replaced == [[]] and list(group.down) == [1]
    sync(2)  # replacement asked for, not up yet
    sync(3)  # it did not start: said, asked for again at the next sync
    assert fleet.replaced == [[], [1], [1]] and list(group.down) == [1]
    assert "lost server 1 did not start (RuntimeError: no node)" in capsys.readouterr().out
    sync(4)
    new = group.engines[1]
    assert new.base_url == "http://new/v1" and not group.down and b.closed
    assert [c[1] for c in new.calls] == [f"{sync.prefix}-v4"]  # this version, then probed
    assert new.probes == [1.0, 1.0, 0.4, 0.4] and group.members == [a, new]
    assert fleet.replaced == [[], [1], [1], [1]]  # asked for while it was down
    group.engines[1].fail = ServerUnreachable("http://new/v1: connection refused")
    original = FakeServer.twin
    FakeServer.twin = lambda self, url: FakeServer(self.kind, self.served, fail="bad disk",
                                                   base_url=url)
    try:
        sync(5)  # lost again; sync 6: its replacement cannot take the weights
        sync(6)
    finally:
        FakeServer.twin = original
    assert list(group.down) == [1] and group.engines[1].base_url == "http://new/v1"
    assert "http://bad/v1 did not take the weights" in capsys.readouterr().out


def test_a_run_whose_server_is_gone_stops_naming_the_stage_and_the_resume(tmp_path,
                                                                         fresh_accelerate):
    from conftest import free_port
    from gaca_agent.training.loop import TrainingStopped, train

    cfg = load_config(str(DEFAULT), [
        f"out_dir={tmp_path}", "name=gone", "iterations=1", "eval_every=0",
        "warmup.bc_steps=0", "model.engine=server", "server.model=tiny", "server.retries=0",
        f"server.base_url=http://127.0.0.1:{free_port()}/v1", "learner.old_logprobs=recompute"])
    with pytest.raises(TrainingStopped) as stopped:
        train(cfg, progress=False)
    message = str(stopped.value)
    assert message.startswith("the warm-up stopped: WeightSyncError: weight sync of version 0")
    assert message.endswith(f"no checkpoint yet: gaca-train --resume {tmp_path / 'gone'} "
                            "starts it over")
    assert stopped.value.latest is None and stopped.value.run_dir == tmp_path / "gone"


def test_a_sync_goes_to_every_server_and_drops_one_found_gone(tmp_path):
    """server.replicas: each version is loaded and probed on every server; one found gone
    at a sync is dropped and the sync goes on; the last one gone stops the run."""
    from gaca_agent.generate.http import ServerUnreachable
    from gaca_agent.generate.server_engine import WeightSyncError
    from gaca_agent.generate.server_group import ServerGroup

    sync, _, a = weight_sync(tmp_path, lora=True)
    b = FakeServer("vllm", a.served, base_url="http://other/v1")
    sync.engine = group = ServerGroup([a, b])
    sync(1)
    assert [c[1] for c in a.calls] == [c[1] for c in b.calls] == [f"{sync.prefix}-v1"]
    assert a.probes == b.probes == [1.0, 1.0, 0.4, 0.4]  # both servers, both temperatures
    b.fail = WeightSyncError("the server did not load adapter ...")  # as the engine says it
    b.fail.__cause__ = ServerUnreachable("http://other/v1: connection refused")
    assert sync(2)["sync/version"] == 2.0 and list(group.down) == [1]
    assert len(a.calls) == 2 and group.members == [a]
    a.fail = ServerUnreachable("http://fake/v1: connection refused")
    with pytest.raises(WeightSyncError, match="connection refused"):
        sync(3)  # the last server: nothing to go on with
    b.fail, a.fail = None, RuntimeError("disk quota")
    group.down.clear()
    with pytest.raises(WeightSyncError, match="disk quota"):
        sync(4)  # a refusal is no lost server: the run stops
