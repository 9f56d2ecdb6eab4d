"""The asynchronous part of the GPU check (``benchmarks/gpu_check.py``, check 5): a
``gaca-serve`` process on the same device, the learner's full weights broadcast to it
(NCCL on a GPU, gloo on CPU), then one rollout batch sampled while the learner updates
on the previous one."""

from __future__ import annotations

import hashlib
import threading
import time

from serve_process import start_gaca_serve


def digest(tensor) -> str:
    import torch

    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)
                          .numpy()).hexdigest()


def async_iteration(path: str, tok, n: int, new: int, device: str, emit) -> None:
    import numpy as np
    import torch

    from gaca_agent.generate.http import post_json
    from gaca_agent.generate.probe import probe
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.transfer import Broadcaster, update_by_broadcast
    from gaca_agent.learner.core import Learner, LearnerConfig
    from gaca_agent.steps import StepTable

    proc, base = start_gaca_serve(path, "qwen-shape", "--device", device, "--dtype",
                                  "bfloat16" if device == "cuda" else "float32")
    engine = ServerEngine(base, "qwen-shape", tok, kind="sglang", timeout_s=600)
    learner = Learner(path, tok, LearnerConfig(bf16=True, kl_coef=0.0, lr=1e-6,
                                               old_logprobs="recompute", tis_cap=2.0))
    sender = Broadcaster(engine, backend="nccl" if device == "cuda" else "gloo",
                         timeout_s=300, bucket_bytes=1 << 30, group_name="gpu-check")
    try:
        wire = "bfloat16" if device == "cuda" else "float32"
        named = learner.full_weights(wire)
        t0 = time.perf_counter()
        sent = update_by_broadcast(engine, sender, named, "check-v1", 1)
        seconds = time.perf_counter() - t0
        served = post_json(base[:-3] + "/weight_checker", {"action": "checksum"})["checksums"]
        equal = served == {k: digest(v) for k, v in named}
        with learner.rollout_context():
            gap = probe(engine, learner.score, 1.0, 32).mean_gap
        emit("async", step="broadcast", gb=round(sent["perf/sync_bytes"] / 2**30, 3),
             seconds=round(seconds, 3), gb_per_s=round(sent["perf/sync_bytes"] / 2**30 /
                                                       max(seconds, 1e-9), 2),
             checksums_equal=equal, probe_mean_gap=round(gap, 4))
        messages = [[{"role": "user", "content": f"Task {i}: reach the exit."}] for i in range(n)]

        def rollouts(offset: int):
            outs = [f.result() for f in [engine.submit(m, new, 1.0, key=offset + i, version=1)
                                         for i, m in enumerate(messages)]]
            return StepTable.from_tokens([c.prompt_ids for c in outs],
                                         [c.completion_ids for c in outs],
                                         [c.logprobs for c in outs])

        def timed(fn):
            t = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - t

        table, collect_s = timed(lambda: rollouts(0))
        _, update_s = timed(lambda: learner.update(table, np.linspace(-1, 1, n)))
        box = {}
        worker = threading.Thread(target=lambda: box.update(t=rollouts(1000)))
        t0 = time.perf_counter()
        worker.start()  # the next batch, sampled while the learner updates on this one
        learner.update(table, np.linspace(-1, 1, n))
        worker.join()
        both_s = time.perf_counter() - t0
        emit("async", step="overlap", collect_s=round(collect_s, 2),
             update_s=round(update_s, 2), overlapped_s=round(both_s, 2),
             speedup=round((collect_s + update_s) / both_s, 2))
    finally:
        sender.close()
        engine.close()
        proc.kill()
        del learner
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
