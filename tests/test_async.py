"""Asynchronous training (``max_staleness``): the producer's schedule, weight versions as
data, the decoupled objective's importance weights, the full-weight broadcast into a
real gaca-serve process (bit-equal, and a stall stops in one line), gaca-serve's pause
modes, and asynchronous runs through gaca-serve (versions within K, as the server
reported them; killed and resumed exactly)."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time

import numpy as np
import pytest

from conftest import has_module
from gaca_agent.config import load_config
from gaca_agent.learner.correction import Correction, geometric_means, importance_weights
from gaca_agent.training.producer import Batch, Producer, ProducerStopped

SERVER = ["model.engine=server", "server.base_url=http://127.0.0.1:1/v1", "server.model=tiny",
          "learner.old_logprobs=recompute"]


def test_importance_weights_are_the_ratio_truncated_or_masked():
    rng = np.random.default_rng(0)
    offsets = np.array([0, 3, 3, 7, 9])  # four steps, one without tokens
    prox = rng.normal(-1.0, 0.3, 9)
    behav = prox - rng.normal(0.0, 0.8, 9)
    behav[5] = np.nan  # a token without a rollout log-prob
    rho = [math.exp(p - b) if b == b else 1.0 for p, b in zip(prox, behav)]
    none, stats = importance_weights(prox, behav, offsets, Correction())
    assert none is None and stats["ratio_n"] == 8
    assert stats["ratio_sum"] == pytest.approx(sum(r for i, r in enumerate(rho) if i != 5))
    assert stats["ratio_max"] == pytest.approx(max(r for i, r in enumerate(rho) if i != 5))
    capped, stats = importance_weights(prox, behav, offsets, Correction(cap=1.5))
    assert capped.tolist() == pytest.approx([min(r, 1.5) for r in rho])
    assert stats["truncated"] == sum(r > 1.5 for i, r in enumerate(rho) if i != 5)
    band, stats = importance_weights(prox, behav, offsets, Correction(band=(0.8, 1.25)))
    assert band.tolist() == pytest.approx([r if 0.8 <= r <= 1.25 else 0.0 for r in rho])
    assert stats["masked"] == sum(not 0.8 <= r <= 1.25 for i, r in enumerate(rho) if i != 5)
    geo = [math.exp(np.mean([math.log(rho[i]) for i in range(a, b) if i != 5]))
           if b > a else 1.0 for a, b in zip(offsets[:-1], offsets[1:])]
    assert geometric_means(np.array(rho), ~np.isnan(behav), offsets).tolist() == \
        pytest.approx(geo)
    seq, _ = importance_weights(prox, behav, offsets, Correction(cap=2.0, geo_band=(0.9, 1.1)))
    row = np.repeat(np.arange(4), np.diff(offsets))
    assert seq.tolist() == pytest.approx([min(rho[i], 2.0) if 0.9 <= geo[row[i]] <= 1.1
                                          else 0.0 for i in range(9)])


def test_config_says_what_asynchronous_training_needs():
    assert load_config(None, SERVER + ["max_staleness=2", "learner.tis_cap=2"]) \
        .max_staleness == 2
    for correction in ("learner.is_mask=[0.5, 2]", "learner.is_geo_mask=[0.5, 2]"):
        assert load_config(None, SERVER + ["max_staleness=1", correction]).max_staleness == 1
    with pytest.raises(ValueError, match="needs an importance correction for them: add "
                                         "learner.tis_cap: 2"):
        load_config(None, SERVER + ["max_staleness=1"])
    with pytest.raises(ValueError, match="max_staleness: 1 needs model.engine: server"):
        load_config(None, ["max_staleness=1"])
    with pytest.raises(ValueError, match="old_logprobs: recompute"):
        load_config(None, SERVER[:3] + ["learner.lora_r=4", "max_staleness=1"])
    with pytest.raises(ValueError, match="partial_rollouts needs max_staleness >= 1"):
        load_config(None, ["partial_rollouts=true"])
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        load_config(None, ["max_staleness=-1"])
    with pytest.raises(ValueError, match="broadcast is for full fine-tuning"):
        load_config(None, SERVER + ["learner.lora_r=4", "server.weight_transfer=broadcast"])
    with pytest.raises(ValueError, match="is_mask must be"):
        load_config(None, SERVER + ["learner.is_mask=[1.2, 2]"])
    with pytest.raises(ValueError, match="is_geo_mask needs old_logprobs"):
        load_config(None, ["learner.is_geo_mask=[0.5, 2]"])
    cfg = load_config(None, SERVER + ["learner.is_mask=[0.5, 2]", "learner.tis_cap=3"])
    assert cfg.learner.correction == Correction(3.0, (0.5, 2.0), None)


class Recorder:
    """A collect function that records (iteration, pinned version, synced then)."""

    def __init__(self, producer_ref, delay=0.0, fail_at=None):
        self.calls, self.ref, self.delay, self.fail_at = [], producer_ref, delay, fail_at

    def __call__(self, it, version):
        if it == self.fail_at:
            raise ConnectionError("the inference server is gone")
        self.calls.append((it, version, self.ref[0].synced if self.ref[0] else 0))
        time.sleep(self.delay)
        return Batch(it, f"rollout {it}", self.delay, version)


def bounded(producer, work, timeout_s=30.0):
    """``work()`` (the learner's side), failing rather than hanging if the schedule
    deadlocks (on a daemon thread: a stuck one cannot hold the test process)."""
    out: dict = {}

    def call():
        try:
            out["value"] = work()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            out["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        producer.close()
        pytest.fail("the learner waited for ever: the schedule deadlocked")
    if "error" in out:
        raise out["error"]
    return out["value"]


def get(producer, it):
    return bounded(producer, lambda: producer.get(it))


def run_learner(producer, iterations, start=0, updates=0.02):
    def learn():
        got = []
        for it in range(start, iterations):
            got.append(producer.get(it))
            time.sleep(updates)  # the update
            producer.before_sync(it + 1)
            producer.after_sync(it + 1)
        return got
    return bounded(producer, learn)


@pytest.mark.parametrize("k", [1, 2])
def test_the_producer_pins_iteration_j_to_version_j_minus_k(k):
    ref = [None]
    collect = Recorder(ref, delay=0.01)
    producer = ref[0] = Producer(collect, 0, 6, k, synced=0, drain=True)
    batches = run_learner(producer, 6)
    assert [b.iteration for b in batches] == list(range(6))
    assert [(it, v) for it, v, _ in collect.calls] == [(j, max(0, j - k)) for j in range(6)]
    assert all(synced >= v for _, v, synced in collect.calls)  # admitted once synced
    # with one served version at a time, the sync of v waited for every iteration pinned
    # to v - 1: none started on a version the server no longer had
    assert all(synced == v for _, v, synced in collect.calls)
    assert [b.version for b in batches] == [max(0, j - k) for j in range(6)]


def test_the_producer_runs_ahead_and_a_checkpoint_keeps_what_it_collected():
    ref = [None]
    collect = Recorder(ref)
    producer = ref[0] = Producer(collect, 0, 8, 2, synced=0)
    assert get(producer, 0).iteration == 0
    ahead = bounded(producer, lambda: producer.ahead(0))  # a checkpoint after iteration 0
    assert [b.iteration for b in ahead] == [1, 2]
    producer.after_sync(1)
    deadline = time.time() + 5
    while producer.collected < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert producer.collected == 3 and 4 not in producer.ready  # 4 needs version 2
    producer.close()  # the thread waiting for version 2 ends, collecting nothing more
    producer._thread.join(timeout=5)
    assert not producer._thread.is_alive() and producer.collected == 3
    resumed_calls = Recorder(ref)
    resumed = ref[0] = Producer(resumed_calls, 1, 8, 2, synced=1, ready=ahead)
    assert [b.iteration for b in run_learner(resumed, 8, start=1)] == list(range(1, 8))
    assert [it for it, _, _ in resumed_calls.calls] == [3, 4, 5, 6, 7]  # 1, 2 kept
    assert [v for _, v, _ in resumed_calls.calls] == [1, 2, 3, 4, 5]
    # a finished run extended (its last checkpoint kept nothing ahead): the server has only
    # the checkpoint's version 8, so the first iterations are sampled by it, not by 6 and 7
    extended_calls = Recorder(ref)
    extended = ref[0] = Producer(extended_calls, 8, 11, 2, synced=8)
    assert [b.version for b in run_learner(extended, 11, start=8)] == [8, 8, 8]
    assert [(it, v) for it, v, _ in extended_calls.calls] == [(8, 8), (9, 8), (10, 8)]


def test_a_failing_producer_stops_the_learner_with_its_reason():
    ref = [None]
    producer = ref[0] = Producer(Recorder(ref, fail_at=1), 0, 4, 1, synced=0)
    assert get(producer, 0).iteration == 0
    with pytest.raises(ProducerStopped, match="ConnectionError: the inference server is gone"):
        producer.get(1)
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        Producer(Recorder(ref), 0, 4, 0, synced=0)


def test_stale_groups_are_dropped_and_counted():
    from gaca_agent.steps import Episode, Rollout, StepTable
    from gaca_agent.training.producer import drop_stale

    table = StepTable.from_tokens([[1]] * 4, [[2]] * 4, [[-0.1]] * 4)
    table.columns["group"] = np.array([0, 0, 1, 2])
    table.columns["policy_version"] = np.array([3, 1, 3, -1])  # group 0 holds a stale step
    episodes = [Episode(g, g, 0, 0) for g in (0, 1, 2)]
    rollout = Rollout(episodes, table)
    assert drop_stale(rollout, 4, 2) == 1
    assert rollout.table["failed"].tolist() == [True, True, False, False]
    assert episodes[0].failed and "more than 2 weight versions" in episodes[0].error
    assert not episodes[1].failed and not episodes[2].failed  # -1: unknown, kept
    assert drop_stale(rollout, 4, 3) == 0


class Ranks:
    """An accelerator of one rank among two: the other rank's reduce and gather inputs are
    recorded first (``other=None``), then combined with this rank's as the collectives
    would."""

    num_processes, device = 2, "cpu"

    def __init__(self, other=None):
        self.other, self.sent = other, []

    def reduce(self, t, reduction):
        assert reduction == "sum"
        self.sent.append(t)
        return t if self.other is None else t + self.other.sent[0]

    def gather(self, t):
        import torch

        self.sent.append(t)
        return t if self.other is None else torch.cat([t, self.other.sent[1]])


def test_staleness_metrics_over_two_ranks_are_those_of_their_union():
    from types import SimpleNamespace

    from gaca_agent.steps import StepTable
    from gaca_agent.training.producer import staleness_metrics

    def table(versions, lengths):
        t = StepTable.from_tokens([[1]] * len(versions), [[2] * n for n in lengths],
                                  [[-0.1] * n for n in lengths])
        return t.with_columns(policy_version=np.array(versions))

    a = table([5, 4, -1], [2, 6, 9])  # iteration 5: 0 and 1 behind; -1: not known
    b = table([3, 4], [1, 3])  # 2 and 1 behind
    one = SimpleNamespace(num_processes=1, device="cpu")
    union = staleness_metrics(one, StepTable.concat([a, b]), 5, 3, 1.0)
    assert union == {"async/stale_min": 0.0, "async/stale_max": 2.0,
                     "async/stale_mean": pytest.approx((0 * 2 + 1 * 6 + 2 * 1 + 1 * 3) / 12),
                     "async/dropped_groups": 3.0, "async/wait_s": 1.0}
    other = Ranks()
    staleness_metrics(other, b, 5, 1, 3.0)
    both = staleness_metrics(Ranks(other), a, 5, 2, 1.0)
    assert both == {**union, "async/wait_s": 2.0}  # the ranks' mean wait
    unknown = table([-1], [4])
    assert staleness_metrics(one, unknown, 5, 0, 0.0) == {
        "async/stale_min": 0.0, "async/stale_max": 0.0, "async/stale_mean": 0.0,
        "async/dropped_groups": 0.0, "async/wait_s": 0.0}
    other = Ranks()
    staleness_metrics(other, unknown, 5, 0, 0.0)  # a rank with no known version
    alone = staleness_metrics(Ranks(other), b, 5, 0, 0.0)
    assert (alone["async/stale_min"], alone["async/stale_max"]) == (1.0, 2.0)


def test_the_version_window_accepts_what_was_fixed_at_submission(scripted):
    from test_generate import chat

    from gaca_agent.generate.server_engine import ServerEngine, StaleWeights
    from gaca_agent.generate.versions import VersionWindow

    window = VersionWindow(keep=2)
    assert window.add(1, "r-v1") == [] and window.add(2, "r-v2") == []
    assert window.add(3, "r-v3") == ["r-v1"] and window.window == ["r-v2", "r-v3"]
    assert window.expect(2).pinned == "r-v2" and window.expect().floor == 2
    with pytest.raises(StaleWeights, match="version 1 is not served any more"):
        window.label_of(1)
    s = scripted({"/v1/chat/completions": [(200, chat(weight_versions=[["r-v2", 0, 3]]))],
                  "/update_weight_version": [(200, {})]})
    started = time.perf_counter()
    e = ServerEngine(s.base, "tiny", None, retries=0, keep_versions=2)
    for v in (1, 2):
        e.weight_version = f"r-v{v}"
    pinned = e.submit([{"role": "user", "content": "go"}], 4, 1.0, key=1, version=1)
    e.weight_version = "r-v3"  # a sync while the turn is in flight
    with pytest.raises(StaleWeights, match=r"\['r-v2'\], this turn was sent to 'r-v1'"):
        pinned.result(timeout=10)
    floating = e.submit([{"role": "user", "content": "go"}], 4, 1.0)  # from r-v2 on
    assert floating.result(timeout=10).policy_version == 2
    assert e.complete([{"role": "user", "content": "go"}], 4, 1.0, version=2).policy_version == 2
    e.weight_version = "r-v4"  # r-v2 leaves the window: an answer from it is stale now
    with pytest.raises(StaleWeights, match="accepts"):
        e.complete([{"role": "user", "content": "go"}], 4, 1.0)
    busy = e.busy_seconds()  # nothing in flight now: the requests' own time only
    assert 0 < busy <= time.perf_counter() - started and e.busy_seconds() == busy
    # one request at a time: a turn queued behind a slow one keeps what it accepted when
    # it was submitted (r-v1 on), though a sync moves the window before it is sent
    one = ServerEngine(s.base, "tiny", None, retries=0, keep_versions=2, concurrency=1)
    one.weight_version, one.weight_version = "r-v1", "r-v2"
    s.script["/v1/chat/completions"] = [("stall", 1.0),
                                         (200, chat(weight_versions=[["r-v1", 0, 3]]))]
    slow = one.submit([{"role": "user", "content": "a"}], 4, 1.0)
    queued = one.submit([{"role": "user", "content": "b"}], 4, 1.0)
    one.weight_version = "r-v3"
    with pytest.raises(Exception):
        slow.result(timeout=10)  # the stalled answer carries no choices
    assert queued.result(timeout=10).policy_version == 1
    one.close()


@pytest.fixture
def scripted():
    from test_generate import Scripted

    made = []

    def make(script):
        made.append(Scripted(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


# ------------------------------------------------------------------ gaca-serve, for real
needs_model = pytest.mark.skipif(not (has_module("torch") and has_module("transformers")),
                                 reason="needs torch and transformers (pip install -e '.[train]')")


def gaca_serve(path):
    from pathlib import Path

    from test_server_engine import start_gaca_serve

    serve, base = start_gaca_serve(path, Path(__file__).resolve().parents[1])
    yield base
    serve.kill()
    serve.wait(timeout=30)


@pytest.fixture(scope="module")
def serve_process(tiny_model_path):
    """A gaca-serve process shared by the broadcast tests (they change its weights)."""
    yield from gaca_serve(tiny_model_path)


@pytest.fixture
def fresh_serve(tiny_model_path):
    """A gaca-serve process of one training run (a run's adapters stay loaded)."""
    yield from gaca_serve(tiny_model_path)


def digests(named):
    import torch

    return {k: hashlib.sha256(v.detach().contiguous().view(-1).view(torch.uint8).numpy())
            .hexdigest() for k, v in named}


@needs_model
def test_buckets_keep_order_and_bound_and_only_the_last_is_labelled(monkeypatch):
    """Tensors go in order, in buckets of at most bucket_bytes (a larger one alone); each
    bucket is one SGLang update request whose metadata lists its tensors; only the last
    flushes the cache and carries the version label; close leaves the group."""
    import torch

    from gaca_agent.generate import transfer

    named = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in
             enumerate([4, 4, 10, 1, 2])]  # 16, 16, 40, 4, 8 bytes
    parts = transfer.buckets(named, 32)
    assert [[n for n, _ in b] for b in parts] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert transfer.buckets([], 32) == []

    class Engine:
        base_url = "http://server/v1"

        def __init__(self):
            self.calls = []

        def _admin(self, endpoint, body):
            self.calls.append((endpoint, body))

    engine, sent = Engine(), []
    monkeypatch.setattr(transfer, "broadcast", lambda t, group, timeout: sent.append(t.numel()))
    sender = transfer.Broadcaster(engine, timeout_s=5, bucket_bytes=32, group_name="g")
    sender.group = "joined"
    out = sender.send(named, "run-v3")
    bodies = [b for e, b in engine.calls if e == "update_weights_from_distributed"]
    assert [b["names"] for b in bodies] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert [b["weight_version"] for b in bodies] == [None, None, "run-v3"]
    assert [b["flush_cache"] for b in bodies] == [False, False, True]
    assert bodies[1]["shapes"] == [[10]] and bodies[1]["dtypes"] == ["float32"]
    assert sent == [4, 4, 10, 1, 2] and out["perf/sync_bytes"] == 84.0
    monkeypatch.setattr(transfer, "destroy", lambda group: None)
    sender.close()
    assert engine.calls[-1] == ("destroy_weights_update_group", {"group_name": "g"})
    assert sender.group is None


@pytest.mark.parametrize("kind, pause, resume", [
    ("sglang", ("pause_generation", {"mode": "in_place"}), "continue_generation"),
    ("vllm", ("pause?mode=keep", None), "resume")])
def test_a_broadcast_is_sent_paused_in_the_servers_own_words(kind, pause, resume):
    """Generation is held (not aborted) around the broadcast and continued even when the
    broadcast fails, which leaves the group to be joined anew; a sent one is the engine's
    newest version, labelled."""
    from gaca_agent.generate.transfer import update_by_broadcast

    class Engine:
        def __init__(self):
            self.kind, self.calls, self.synced_to = kind, [], None

        def _admin(self, endpoint, body=None):
            self.calls.append((endpoint, body))

        def synced(self, version, label, labelled=False):
            self.synced_to = (version, label, labelled)

    class Sender:
        group, fail = "joined", False

        def send(self, named, label):
            if self.fail:
                raise RuntimeError("the peer went away")
            return {"perf/sync_bytes": 8.0}

    engine, sender = Engine(), Sender()
    assert update_by_broadcast(engine, sender, [], "run-v2", 2) == {"perf/sync_bytes": 8.0}
    assert engine.calls == [pause, (resume, None)]
    assert engine.synced_to == (2, "run-v2", True) and sender.group == "joined"
    engine, sender.fail = Engine(), True
    with pytest.raises(RuntimeError, match="went away"):
        update_by_broadcast(engine, sender, [], "run-v3", 3)
    assert engine.calls == [pause, (resume, None)] and sender.group is None
    assert engine.synced_to is None


def test_vllm_broadcast_speaks_vllms_weight_transfer_api(monkeypatch):
    """vLLM's NCCL end cannot run here: its trainer functions are stood in by fakes with
    vLLM 0.33's signatures (keyword-only where vLLM's are), and what the learner sends to
    the server and to those functions is checked: the init payload built by vLLM's own
    function from our rendezvous, the update's names, dtypes and shapes, its label, the
    shutdown; without vllm installed, one line saying what to use instead."""
    import sys
    import types

    from gaca_agent.generate.http import WeightSyncError
    from gaca_agent.generate.transfer import VLLMBroadcaster

    calls = []

    def build_worker_init_payload(init_info, *, packed=False,
                                  packed_buffer_size_bytes=1 << 30, packed_num_buffers=2):
        calls.append(("payload", vars(init_info), packed, packed_buffer_size_bytes,
                      packed_num_buffers))
        return {"built": True}

    def trainer_init(init_info, rank=0):
        calls.append(("trainer_init", dict(init_info), rank))
        return "communicator"

    def packed_nccl_broadcast_producer(iterator, group, src, post_iter_func,
                                       buffer_size_bytes=1 << 30, num_buffers=2):
        items = [post_iter_func(item) for item in iterator]
        calls.append(("broadcast", items, group, src, buffer_size_bytes, num_buffers))

    class Tensor:  # what send reads of a learner tensor (.cuda() needs a GPU)
        def __init__(self, shape, dtype, nbytes):
            self.shape, self.dtype, self.nbytes = shape, dtype, nbytes

        def cuda(self):
            return ("on-gpu", self.shape)

        def numel(self):
            return self.nbytes

        def element_size(self):
            return 1

    nccl = types.SimpleNamespace(build_worker_init_payload=build_worker_init_payload,
                                 trainer_init=trainer_init)
    packed = types.SimpleNamespace(packed_nccl_broadcast_producer=packed_nccl_broadcast_producer,
                                   DEFAULT_PACKED_NUM_BUFFERS=3)
    module = types.ModuleType("vllm.distributed.weight_transfer")
    module.nccl_common, module.packed_tensor = nccl, packed
    for name in ("vllm", "vllm.distributed"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer", module)

    class Engine:
        base_url = "http://server/v1"

        def __init__(self):
            self.calls = []

        def _admin(self, endpoint, body=None):
            self.calls.append((endpoint, body))

    engine = Engine()
    sender = VLLMBroadcaster(engine, host="10.0.0.5", port=29123, timeout_s=5,
                             bucket_bytes=4096)
    named = [("w", Tensor([2, 3], "torch.bfloat16", 12)), ("b", Tensor([3], "torch.float32", 12))]
    out = sender.send(named, "run-v4")
    rendezvous = {"master_address": "10.0.0.5", "master_port": 29123, "world_size": 2}
    assert calls[0] == ("payload", rendezvous, True, 4096, 3)
    assert calls[1] == ("trainer_init", rendezvous, 0) and sender.group == "communicator"
    assert calls[2] == ("broadcast", [("on-gpu", [2, 3]), ("on-gpu", [3])], "communicator", 0,
                        4096, 3)
    assert engine.calls == [
        ("init_weight_transfer_engine", {"init_info": {"built": True}}),
        ("start_weight_update", None),
        ("update_weights", {"update_info": {"names": ["w", "b"],
                                            "dtype_names": ["bfloat16", "float32"],
                                            "shapes": [[2, 3], [3]]}}),
        ("finish_weight_update", {"weight_version": "run-v4"})]
    assert out["perf/sync_bytes"] == 24.0 and out["perf/broadcast_s"] >= 0
    sender.close()
    assert engine.calls[-1] == ("shutdown_weight_transfer_engine", None) and sender.group is None
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer", None)
    with pytest.raises(WeightSyncError, match="needs vllm installed where the learner runs.*"
                                              "server.weight_transfer: disk"):
        VLLMBroadcaster(Engine()).open()


def test_a_bucket_unflattens_into_its_named_tensors_or_says_what_does_not_add_up():
    import torch

    from gaca_agent.generate.transfer import flatten, unflatten

    bucket = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
              ("b", torch.tensor([1.5, -2.0], dtype=torch.bfloat16))]
    flat, names, dtypes, shapes = flatten(bucket)
    assert (names, dtypes, shapes) == (["a", "b"], ["float32", "bfloat16"], [[2, 3], [2]])
    back = unflatten(flat, names, dtypes, shapes)
    assert [n for n, _ in back] == ["a", "b"]
    assert all(torch.equal(x, y) and x.dtype == y.dtype for (_, x), (_, y) in zip(back, bucket))
    with pytest.raises(ValueError, match="holds 28 bytes, its tensors 24"):
        unflatten(flat, ["a"], ["float32"], [[2, 3]])
    with pytest.raises(ValueError):  # a name without its dtype and shape
        unflatten(flat, ["a", "b", "c"], dtypes, shapes)


def test_a_failed_collective_names_the_end_that_failed():
    from gaca_agent.generate.http import WeightSyncError
    from gaca_agent.generate.transfer import Broadcaster

    sender = Broadcaster(None, timeout_s=0.5)

    def boom():
        raise RuntimeError("this end broke")

    with pytest.raises(WeightSyncError, match="sending X failed: RuntimeError: this end "
                                              "broke .every collective is bounded by "
                                              r"server.transfer_timeout_s = 0.5 s\)"):
        sender._both(lambda: {"ok": True}, boom, "sending X")
    with pytest.raises(WeightSyncError, match="sending X failed on the server: "
                                              "RuntimeError: this end broke"):
        sender._both(boom, lambda: None, "sending X")
    hung = threading.Event()
    with pytest.raises(WeightSyncError, match="failed on the server: TimeoutError: no "
                                              "answer in 0.5 s"):
        sender._both(lambda: hung.wait(30), lambda: None, "sending X")
    # the request still waiting does not keep the stopped run's process from exiting
    waiting = [t for t in threading.enumerate() if t.name == "gaca-weight-request"]
    assert len(waiting) == 1 and waiting[0].daemon
    hung.set()
    assert sender._both(lambda: None, lambda: 7, "sending X") == 7


def test_the_broadcast_leaves_the_servers_weights_bit_equal(serve_process, tiny_model_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import full_logprobs
    from gaca_agent.generate.http import post_json
    from gaca_agent.generate.probe import probe
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.transfer import Broadcaster, update_by_broadcast

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    engine = ServerEngine(serve_process, "tiny", tok, kind="sglang", retries=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    named = list(model.state_dict().items())
    sender = Broadcaster(engine, timeout_s=30, bucket_bytes=1 << 16, group_name="bit-equal")
    try:
        sent = update_by_broadcast(engine, sender, named, "run-v1", 1)
        total = sum(v.numel() * v.element_size() for _, v in named)
        assert sent["perf/sync_bytes"] == total  # in several 64 KiB buckets
        root = serve_process[:-3]
        assert post_json(root + "/weight_checker", {"action": "checksum"})["checksums"] == \
            digests(named)
        assert engine.weight_version == "run-v1"
        result = probe(engine, lambda p, c, t: full_logprobs(model, p, c, t).numpy(), 1.0, 8)
        assert result.mean_gap < 1e-4  # the server samples from the broadcast weights
        assert post_json(root + "/weight_checker", {"action": "compare",
                                                    "baseline": digests(named)})["match"]
    finally:
        sender.close()


@needs_model
def test_a_broadcast_that_stalls_stops_in_one_line(serve_process, tiny_model_path, monkeypatch):
    from transformers import AutoTokenizer

    from gaca_agent.generate.http import WeightSyncError
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.transfer import Broadcaster

    engine = ServerEngine(serve_process, "tiny", AutoTokenizer.from_pretrained(tiny_model_path),
                          kind="sglang", retries=0)
    sender = Broadcaster(engine, timeout_s=2, group_name="stall")
    sender.open()
    try:
        admin = engine._admin
        stalled = threading.Event()

        def never_receives(endpoint, body=None):  # the server is never told to receive
            if endpoint == "update_weights_from_distributed":
                stalled.wait(30)
                return {}
            return admin(endpoint, body)

        monkeypatch.setattr(engine, "_admin", never_receives)
        import torch

        big = [("w", torch.zeros(16 << 20, dtype=torch.uint8))]  # beyond any socket buffer
        t0 = time.perf_counter()
        with pytest.raises(WeightSyncError) as err:
            sender.send(big, "run-v9")
        assert time.perf_counter() - t0 < 20
        message = str(err.value)
        assert "\n" not in message and "bucket 1/1" in message and "2 s" in message
        stalled.set()
    finally:
        monkeypatch.undo()
        sender.close()


@needs_model
def test_gaca_serve_holds_or_refuses_requests_while_paused(tiny_model_path):
    from gaca_agent.generate.http import ServerRefused, post_json
    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=4)
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    try:
        post_json(root + "/pause?mode=keep", None, retries=0)
        from gaca_agent.generate.http import get_json

        assert get_json(root + "/is_paused", retries=0) == {"is_paused": True}
        answer = []
        t = threading.Thread(target=lambda: answer.append(
            post_json(root + "/v1/chat/completions", body, retries=0)))
        t.start()
        time.sleep(0.5)
        assert not answer  # held, not refused
        post_json(root + "/resume", None, retries=0)
        t.join(timeout=30)
        assert answer and answer[0]["choices"]
        post_json(root + "/pause?mode=wait", None, retries=0)
        with pytest.raises(ServerRefused) as err:
            post_json(root + "/v1/chat/completions", body, retries=0)
        assert err.value.status == 503
        post_json(root + "/continue_generation", None, retries=0)
        assert post_json(root + "/v1/chat/completions", body, retries=0)["choices"]
        with pytest.raises(ServerRefused, match="mode must be"):
            post_json(root + "/pause_generation", {"mode": "later"}, retries=0)
        for hold in ("retract", "in_place"):  # SGLang's holding modes
            assert post_json(root + "/pause_generation", {"mode": hold}, retries=0) == \
                {"success": True, "message": "paused"}
            held = []
            t = threading.Thread(target=lambda: held.append(
                post_json(root + "/v1/chat/completions", body, retries=0)))
            t.start()
            time.sleep(0.3)
            assert not held and get_json(root + "/is_paused", retries=0)["is_paused"]
            post_json(root + "/continue_generation", None, retries=0)
            t.join(timeout=30)
            assert held and held[0]["choices"]
        post_json(root + "/pause_generation", None, retries=0)  # SGLang's default: abort
        with pytest.raises(ServerRefused) as err:
            post_json(root + "/v1/chat/completions", body, retries=0)
        assert err.value.status == 503
        assert post_json(root + "/resume", None, retries=0) == {"status": "resumed"}
    finally:
        server.shutdown()
        server.server_close()
        model.close()


@needs_model
@pytest.mark.parametrize("swap", ["sglang", "vllm"])
def test_an_answer_held_across_a_weight_swap_carries_the_new_version(tiny_model_path,
                                                                    tmp_path, swap):
    """A request that arrives under version v1 and is held (generation paused) while v2's
    weights and label land is generated by v2, so it is labelled v2 in both servers'
    forms: the label of the weights that generated it, not of those it arrived under."""
    from gaca_agent.generate.http import get_json, post_json
    from gaca_agent.serving.app import ChatModel, make_server

    model = ChatModel(tiny_model_path, "tiny", max_tokens=4)
    model.engine.model.save_pretrained(tmp_path / "w")
    server = make_server(model, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_port}"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "return_weight_versions": True}
    try:
        post_json(root + "/update_weight_version", {"new_version": "v1"}, retries=0)
        post_json(root + "/pause?mode=keep", None, retries=0)
        answer = []
        t = threading.Thread(target=lambda: answer.append(
            post_json(root + "/v1/chat/completions", body, retries=0)))
        t.start()
        deadline = time.monotonic() + 60  # the request is taken, then held by the pause
        while model.batcher.submitted < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert model.batcher.submitted == 1 and not answer
        if swap == "sglang":
            post_json(root + "/update_weights_from_disk",
                      {"model_path": str(tmp_path / "w"), "weight_version": "v2"}, retries=0)
        else:
            post_json(root + "/collective_rpc", {"method": "reload_weights", "kwargs": {
                "weights_path": str(tmp_path / "w")}}, retries=0)
            post_json(root + "/update_weight_version", {"new_version": "v2"}, retries=0)
        assert get_json(root + "/get_weight_version", retries=0) == {"weight_version": "v2"}
        post_json(root + "/resume", None, retries=0)
        t.join(timeout=120)
        [reply] = answer
        assert reply["metadata"] == {"weight_version": "v2"}
        assert [v["version"] for v in reply["choices"][0]["weight_versions"]] == ["v2"]
    finally:
        server.shutdown()
        server.server_close()
        model.close()


@needs_model
def test_an_asynchronous_run_in_process_then_resumed(tmp_path, fresh_serve, fresh_accelerate,
                                                    capsys):
    """The loop itself in the test process (the slow tests run it as a program): one step
    stale through a real gaca-serve with the full weights broadcast; every sync probed at
    both temperatures; then resumed from its checkpoint for two more iterations."""
    from gaca_agent.training.loop import train

    args = ["iterations=2", "eval_every=0", "checkpoint_every=1", "env.groups=2",
            "env.group_size=2", "learner.lr=0.01", "learner.kl_coef=0.0",
            "learner.old_logprobs=recompute", "learner.tis_cap=2", "warmup.bc_steps=5",
            "warmup.bc_episodes=2", "keep_rollouts=tokens", f"out_dir={tmp_path}",
            "name=inproc", "model.engine=server", f"server.base_url={fresh_serve}",
            "server.model=tiny", "server.kind=sglang", "server.weight_transfer=broadcast",
            "model.max_new_tokens=12", "max_staleness=1"]
    run = train(load_config("gaca_agent/configs/default.yaml", args), progress=False)
    assert run == tmp_path / "inproc"
    assert sorted(rows_of(run)) == [-1, 0, 1]
    assert (run / "checkpoints" / "iter-00000" / "ahead.rank0.pkl").exists()
    resumed = train(load_config("gaca_agent/configs/default.yaml",
                                [*args, "iterations=4", "keep_rollouts=true"]),
                    resume=run, progress=False)
    assert resumed == run
    out = capsys.readouterr().out.splitlines()
    # one line per iteration (a second, indented line when every group returned alike)
    lines = [x for x in out if x.startswith("inproc iteration ")]
    assert [x.split(":")[0] for x in lines] == [f"inproc iteration {i}/{n}"
                                                for i, n in ((1, 2), (2, 2), (3, 4), (4, 4))]
    assert "response_ids" in steps_of(run, 1)[0] and "response_ids" not in steps_of(run, 2)[0]
    rows = rows_of(run)
    assert sorted(rows) == [-1, 0, 1, 2, 3]
    assert rows[-1]["sync/version"] == 0 and rows[-1]["probe/mean_gap"] < 1e-4
    for it in range(4):
        r = rows[it]
        # the resumed run's server has only the checkpoint's version 2: iteration 2 starts
        # on it (its checkpoint, the finished run's last, kept no batch collected ahead)
        version = max(0, it - 1) if it < 2 else max(2, it - 1)
        assert {s["policy_version"] for s in steps_of(run, it)} == {version}, it
        assert r["async/stale_min"] == r["async/stale_max"] == r["async/stale_mean"] == \
            it - version
        assert r["async/dropped_groups"] == 0 and r["async/wait_s"] >= 0
        assert r["sync/version"] == it + 1 and r["train/tokens"] > 0
        assert r["probe/mean_gap"] < 1e-4 and r["probe_eval/mean_gap"] < 1e-4  # 1.0 and 0.4
        assert 0 < r["perf/server_busy"] <= 1


ASYNC = """
import json, sys
from gaca_agent.config import load_config
from gaca_agent.training.loop import train

if __name__ == "__main__":
    run = train(load_config("gaca_agent/configs/default.yaml", sys.argv[1:]), progress=False)
    print("RUN", run)
"""


def run_async(tmp_path, base, *extra, name="async", stdout=None, cli=False):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "async_loop.py"
    script.write_text(ASYNC)
    args = ["iterations=4", "eval_every=0", "checkpoint_every=1", "env.groups=2",
            "env.group_size=4", "env.invalid_penalty=-0.1", "learner.lr=0.01",
            "learner.kl_coef=0.0", "learner.old_logprobs=recompute", "learner.tis_cap=2",
            "warmup.bc_steps=10", "keep_rollouts=tokens", f"out_dir={tmp_path}",
            f"name={name}", "model.engine=server", f"server.base_url={base}",
            "server.model=tiny", *extra]
    command = [sys.executable, str(script)]
    if cli:  # through gaca-train itself: its one-line errors
        command = [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config",
                   "default"]
    return subprocess.Popen([*command, *args], cwd=root,
                            stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows_of(run_dir):
    return {r["iteration"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


def steps_of(run_dir, it):
    import gzip

    path = run_dir / "rollouts" / f"iter-{it:05d}.rank0.jsonl.gz"
    return [s for e in map(json.loads, gzip.open(path, "rt")) for s in e["trajectory"]]


@needs_model
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lora", "broadcast"])
def test_an_asynchronous_run_trains_on_versions_within_k(tmp_path, fresh_serve, mode):
    extra = (["learner.lora_r=4"] if mode == "lora" else
             ["server.kind=sglang", "server.weight_transfer=broadcast"])
    proc = run_async(tmp_path, fresh_serve, "max_staleness=1", *extra, name=mode)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err[-3000:]
    run = tmp_path / mode
    rows = rows_of(run)
    for it in range(4):
        versions = {s["policy_version"] for s in steps_of(run, it)}
        assert versions == {max(0, it - 1)}, (it, versions)  # as the server reported them
        assert rows[it]["async/stale_max"] == rows[it]["async/stale_min"] == min(it, 1)
        assert rows[it]["async/dropped_groups"] == 0 and rows[it]["sync/version"] == it + 1
        assert rows[it]["probe/mean_gap"] < 1e-4  # the server serves the learner's weights
        assert 0 < rows[it]["perf/server_busy"] <= 1 and 0 < rows[it]["perf/learner_busy"] <= 1
    assert rows[2]["train/is_ratio_max"] > 1.0  # sampled by older weights: a real ratio
    assert len(list((run / "checkpoints" / "iter-00003").glob("ahead.rank0.pkl"))) == 0
    assert len(list((run / "checkpoints" / "iter-00002").glob("ahead.rank0.pkl"))) == 1


@needs_model
@pytest.mark.slow
def test_an_asynchronous_run_killed_and_resumed_gives_the_same_metrics(tmp_path,
                                                                      fresh_serve):
    import signal
    import subprocess
    import sys

    full = run_async(tmp_path, fresh_serve, "max_staleness=1", "learner.lora_r=4",
                     name="full")
    assert full.wait(timeout=900) == 0, full.stderr.read()[-3000:]
    killed = run_async(tmp_path, fresh_serve, "max_staleness=1", "learner.lora_r=4",
                       name="killed")
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and killed.poll() is None:
        if latest.exists() and latest.read_text().strip() == "iter-00001":
            killed.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    killed.wait(timeout=60)
    resumed_from = int(latest.read_text().strip()[-1]) + 1
    assert resumed_from in (2, 3)
    resumed = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress",
                              "--resume", str(tmp_path / "killed")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = rows_of(tmp_path / "full"), rows_of(tmp_path / "killed")
    assert sorted(a) == sorted(b) == [-1, 0, 1, 2, 3]
    for it in range(resumed_from, 4):
        # the first resumed iteration trains on the batch its checkpoint kept; a later one
        # was sampled again by the same weights with the same keys (gaca-serve can flip a
        # near-tied token when it batches by timing, test_server_engine.same_samples)
        same = [s["response"] for s in steps_of(tmp_path / "full", it)] == \
            [s["response"] for s in steps_of(tmp_path / "killed", it)]
        assert same or it > resumed_from, it
        if not same:
            continue
        for key, value in a[it].items():
            if key.startswith(("perf/", "async/wait_s", "sync/seconds")):
                continue
            assert b[it][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (it, key)


@needs_model
@pytest.mark.slow
def test_an_asynchronous_run_stops_in_one_line_when_its_server_dies_and_resumes(tmp_path,
                                                                               tiny_model_path):
    """The producer's thread finds gaca-serve gone: the run stops with one line naming
    the server and the intact checkpoint; with a fresh gaca-serve on the same port,
    --resume finishes it."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import free_port, stop_at_first_checkpoint
    from test_server_engine import start_gaca_serve

    root = Path(__file__).resolve().parents[1]
    port = free_port()
    serve, base = start_gaca_serve(tiny_model_path, root, port)
    run = run_async(tmp_path, base, "max_staleness=1", "learner.lora_r=4", "iterations=3",
                    "server.retries=1", name="died", stdout=subprocess.DEVNULL,
                    cli=True)
    stopped, error = stop_at_first_checkpoint(run, tmp_path / "died", serve, 3)
    assert f"127.0.0.1:{port}" in error, error
    serve, _ = start_gaca_serve(tiny_model_path, root, port)
    try:
        resumed = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress",
                                  "--resume", str(tmp_path / "died")], cwd=root,
                                 capture_output=True, text=True, timeout=900)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    finally:
        serve.kill()
        serve.wait(timeout=30)
    rows = rows_of(tmp_path / "died")
    assert sorted(rows) == [-1, 0, 1, 2]
    for it in range(stopped - 1, 3):  # what the resumed run played, one version behind
        assert {s["policy_version"] for s in steps_of(tmp_path / "died", it)} == \
            {max(0, it - 1)}
        assert rows[it]["probe/mean_gap"] < 1e-4


@needs_model
@pytest.mark.slow
def test_two_servers_share_the_episodes_and_one_lost_leaves_the_run_going(tmp_path,
                                                                       tiny_model_path,
                                                                       fresh_accelerate,
                                                                       monkeypatch):
    """server.replicas: episodes spread over two gaca-serve processes, adapters synced and
    probed on both; one killed after the first iteration, the run finishes on the other."""
    from pathlib import Path

    from conftest import once_logged, picks_of
    from gaca_agent.training.loop import train
    from test_server_engine import start_gaca_serve

    root = Path(__file__).resolve().parents[1]
    (a, url_a), (b, url_b) = (start_gaca_serve(tiny_model_path, root) for _ in range(2))
    picked = picks_of(monkeypatch)
    run_dir = tmp_path / "two"
    once_logged(run_dir, 0, lambda: (picked.append("killed"), b.kill()))
    try:
        train(load_config("gaca_agent/configs/default.yaml", [
            "iterations=3", "eval_every=0", "checkpoint_every=0", "env.groups=2",
            "env.group_size=2", "learner.old_logprobs=recompute", "learner.lora_r=4",
            "warmup.bc_steps=5", "warmup.bc_episodes=2", f"out_dir={tmp_path}", "name=two",
            "model.engine=server", f"server.base_url={url_a}", f"server.replicas=[{url_b}]",
            "server.model=tiny", "server.retries=0", "model.max_new_tokens=12"]),
            progress=False)
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait(timeout=30)
    killed = picked.index("killed")
    assert set(picked[:killed]) == {0, 1}  # both served before
    after = picked[killed + 1:]  # at most the 4 live episodes' turns before it was known
    assert after.count(1) <= 4 and set(after[-10:]) == {0}
    rows = rows_of(run_dir)
    assert sorted(rows) == [-1, 0, 1, 2] and all(rows[i]["probe/mean_gap"] < 1e-4 for i in rows)
