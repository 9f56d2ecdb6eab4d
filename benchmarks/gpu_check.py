"""The real-scale check, sized for one GPU and a few minutes (``scripts/gpu_check.sh``).

A model with Qwen2.5-1.5B-Instruct's shape and random weights (the configuration is
written out below: no download), our own small tokenizer (the prompts are random token
ids), and nothing but torch, transformers, accelerate and peft. It prints, as JSON lines:

1. ``rollout``: generated tokens/s of the ``hf`` and ``paged`` engines on 64 prompts of
   1,024 tokens, up to 512 new tokens each; a random model rarely samples any one token,
   so 1,000 token ids are made end-of-sequence ids: responses end at random lengths
   (mean ~150), as an agent's do. Both engines run under the learner's bf16 autocast on
   its fp32 weights, as in training.
2. ``learner``: one PPO update (64 samples: prompt 1,024 + completion 256 tokens,
   micro-batches of 8, gradient checkpointing, KL to a reference, bf16 compute with fp32
   masters, recomputed old log-probs): seconds, trained tokens/s, peak GPU memory, for
   full fine-tuning and LoRA r=16.
3. ``small_steps``: after an update at lr 1e-6, the share of weights that changed (fp32
   masters) and the share that would have changed had the weights been bf16 (the same
   step added to bf16 weights).
4. ``server``: one iteration of ``model.engine: server`` with full fine-tuning against a
   ``gaca-serve`` on the same GPU (bf16): the weights synced from disk, the probe's
   learner/server log-prob gap at temperatures 1 and 0.4 (bf16 kernels on both sides),
   16 rollout requests in flight at once, one PPO update on their tokens, the sync of the
   updated weights and the probe again (it must pass the default tolerance, 0.05).
5. ``async``: one asynchronous iteration against a ``gaca-serve`` process on the same GPU:
   the full weights broadcast over NCCL (bf16; seconds, GB/s, the server's checksums
   equal the learner's, the probe), then the next rollouts sampled while the learner
   updates on the last ones (wall seconds against the two one after the other)
   (``benchmarks/gpu_check_async.py``).

    python benchmarks/gpu_check.py            # on a GPU
    python benchmarks/gpu_check.py --small    # a tiny model of the same kind, on CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

QWEN2_5_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                    num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                    max_position_embeddings=32768, rope_theta=1_000_000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
SMALL = dict(QWEN2_5_1_5B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def emit(kind: str, **fields) -> None:
    print(json.dumps({"check": kind, **fields}), flush=True)


def build(path: str, shape: dict, device):
    """A Qwen2 model of ``shape`` (seed 0) with the tiny tokenizer, saved at ``path``;
    returns the model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gaca_agent.policies.tiny_model import build_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(**shape)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return model


def rollout(learner, tok, n: int, prompt: int, new: int, device) -> None:
    import torch

    from gaca_agent.generate.engines import Request
    from gaca_agent.generate.factory import make_engine

    model = learner.unwrapped
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    stops = torch.randperm(vocab - 1000, generator=g)[:1000] + 1000
    model.generation_config.eos_token_id = stops.tolist()
    requests = [Request(tuple(torch.randint(1000, vocab, (prompt,), generator=g).tolist()),
                        new, 1.0, key=i) for i in range(n)]
    for name in ("hf", "paged"):
        engine = make_engine(name, model, tok, device)
        with learner.rollout_context():
            engine.generate(requests[:2])  # warm-up
            _sync(device)
            start = time.perf_counter()
            out = engine.generate(requests)
            _sync(device)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.completion_ids) for c in out)
        emit("rollout", engine=name, requests=n, prompt_tokens=prompt, generated=tokens,
             mean_length=round(tokens / n, 1), seconds=round(seconds, 2),
             tokens_per_s=round(tokens / seconds, 1))


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def learner_update(path: str, tok, lora: int, n: int, prompt: int, comp: int, device) -> None:
    import numpy as np
    import torch

    from gaca_agent.learner.core import Learner, LearnerConfig
    from gaca_agent.steps import StepTable

    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = LearnerConfig(lr=1e-6, kl_coef=0.01, micro_batch_size=8, bf16=True,
                        gradient_checkpointing=True, old_logprobs="recompute", lora_r=lora,
                        lora_alpha=32)
    learner = Learner(path, tok, cfg)
    vocab = learner.unwrapped.config.vocab_size
    rng = np.random.default_rng(0)
    table = StepTable.from_tokens([rng.integers(1000, vocab, prompt).tolist() for _ in range(n)],
                        [rng.integers(1000, vocab, comp).tolist() for _ in range(n)],
                        [[-12.0] * comp] * n)
    adv = rng.normal(size=n)
    before = {k: p.detach().clone() for k, p in learner.unwrapped.named_parameters()
              if p.requires_grad}
    learner.update(table, adv)  # warm-up (and the first step)
    _sync(device)
    start = time.perf_counter()
    metrics = learner.update(table, adv)
    _sync(device)
    seconds = time.perf_counter() - start
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
    emit("learner", mode=f"lora_r{lora}" if lora else "full", samples=n,
         prompt_tokens=prompt, completion_tokens=comp, seconds=round(seconds, 2),
         trained_tokens_per_s=round(metrics["train/tokens"] / seconds, 1),
         all_tokens_per_s=round(n * (prompt + comp) / seconds, 1),
         peak_memory_gib=peak, kl=metrics["losses/kl"])
    if not lora:
        changed = kept_bf16 = total = 0
        for k, p in learner.unwrapped.named_parameters():
            if k not in before:
                continue
            w0, w1 = before[k].float(), p.detach().float()
            changed += int((w1 != w0).sum())
            kept_bf16 += int((w0.bfloat16() + (w1 - w0)).bfloat16().ne(w0.bfloat16()).sum())
            total += w0.numel()
        emit("small_steps", lr=1e-6, updates=2, changed_fp32_masters=round(changed / total, 4),
             would_change_bf16_weights=round(kept_bf16 / total, 4))
    del learner
    if cuda:
        torch.cuda.empty_cache()


def server_iteration(path: str, tok, n: int, new: int, device) -> None:
    import threading

    import numpy as np

    from gaca_agent.learner.core import Learner, LearnerConfig
    from gaca_agent.generate.probe import check, probe
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.steps import StepTable
    from gaca_agent.serving.app import ChatModel, make_server

    served = ChatModel(path, "qwen-shape", device=device,
                       dtype="bfloat16" if device == "cuda" else "float32", max_batch=n)
    http = make_server(served, "127.0.0.1", 0)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    engine = ServerEngine(f"http://127.0.0.1:{http.server_port}/v1", "qwen-shape", tok)
    learner = Learner(path, tok, LearnerConfig(bf16=True, kl_coef=0.0, lr=1e-6,
                                               old_logprobs="recompute"))
    weights = tempfile.mkdtemp()
    try:
        for version in (0, 1):
            t0 = time.perf_counter()
            learner.save_weights(f"{weights}/v{version}", "bfloat16")
            engine.update_weights_from_disk(f"{weights}/v{version}", f"check-v{version}")
            sync_s = time.perf_counter() - t0
            gaps = {}
            with learner.rollout_context():
                for t in (1.0, 0.4):
                    result = probe(engine, learner.score, t, 32)
                    gaps[t] = result
            emit("server", step=f"sync v{version}", sync_s=round(sync_s, 2),
                 probe_mean_gap={str(t): round(r.mean_gap, 4) for t, r in gaps.items()},
                 probe_max_gap={str(t): round(r.max_gap, 4) for t, r in gaps.items()},
                 seed_honoured=all(r.seed_honoured for r in gaps.values()))
            for r in gaps.values():
                check(r, 0.05, "vllm")
            if version == 1:
                break
            t0 = time.perf_counter()
            messages = [[{"role": "user", "content": f"Task {i}: reach the exit."}]
                        for i in range(n)]
            futures = [engine.submit(m, new, 1.0, key=1000 + i) for i, m in enumerate(messages)]
            outs = [f.result() for f in futures]
            tokens = sum(len(c.completion_ids) for c in outs)
            emit("server", step="rollout", requests=n, generated=tokens,
                 tokens_per_s=round(tokens / (time.perf_counter() - t0), 1))
            table = StepTable.from_tokens([c.prompt_ids for c in outs], [c.completion_ids for c in outs],
                                [c.logprobs for c in outs])
            metrics = learner.update(table, np.linspace(-1, 1, n))
            emit("server", step="update", rollout_logprob_gap=round(
                metrics["train/rollout_logprob_gap"], 5),
                 is_ratio_max=round(metrics["train/is_ratio_max"], 4))
    finally:
        engine.close()
        http.shutdown()
        served.close()
        del learner


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true",
                        help="a tiny model of the same kind on CPU (a smoke run)")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    cuda = torch.cuda.is_available() and not args.small
    if not cuda and not args.small:
        print("no GPU: run with --small for the CPU smoke version", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    shape = QWEN2_5_1_5B if not args.small else SMALL
    sizes = (64, 1024, 512, 256) if not args.small else (4, 32, 16, 8)
    n, prompt, new, comp = sizes
    path = tempfile.mkdtemp() + "/qwen-shape"
    t0 = time.perf_counter()
    build(path, shape, device)
    tok = AutoTokenizer.from_pretrained(path)
    emit("setup", device=torch.cuda.get_device_name() if cuda else "cpu",
         torch=torch.__version__, build_s=round(time.perf_counter() - t0, 1))
    from gaca_agent.learner.core import Learner, LearnerConfig

    learner = Learner(path, tok, LearnerConfig(bf16=True, kl_coef=0.0))
    rollout(learner, tok, n, prompt, new, device)
    del learner
    for lora in (0, 16):
        learner_update(path, tok, lora, n, prompt, comp, device)
    from gaca_agent.policies.tiny_model import CHAT_TEMPLATE

    tok.chat_template = CHAT_TEMPLATE
    server_iteration(path, tok, 16 if cuda else 4, 128 if cuda else 8, device)
    from gpu_check_async import async_iteration

    async_iteration(path, tok, 16 if cuda else 4, 128 if cuda else 8, device, emit)
    emit("done", seconds=round(time.perf_counter() - t0, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
