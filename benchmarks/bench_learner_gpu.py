"""Learner on one GPU: tokens/s and peak memory of a PPO update, Qwen2.5-1.5B's shape.

A randomly initialised model with Qwen2.5-1.5B-Instruct's configuration (written out
here, no download; random weights run at the real speed) in bf16, full fine-tuning and
LoRA (r=16), gradient checkpointing on, KL to a reference. Batches of 64 step samples
(prompt 1,024, completion 256 tokens). Finishes in a few minutes on an H100/H200.

    python benchmarks/bench_learner_gpu.py [--samples 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

QWEN2_5_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                    num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                    max_position_embeddings=32768, rope_theta=1_000_000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)


def main(argv=None) -> int:
    import torch
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from gaca_agent.learner.core import Learner, LearnerConfig
    from gaca_agent.steps import StepTable

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU: this benchmark needs CUDA", file=sys.stderr)
        return 2
    from gaca_agent.policies.tiny_model import build_tokenizer

    path = tempfile.mkdtemp() + "/qwen-shape"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_5_1_5B)).to(torch.bfloat16)
    model.save_pretrained(path)
    tok: PreTrainedTokenizerFast = build_tokenizer()
    tok.save_pretrained(path)
    del model
    g = torch.Generator().manual_seed(0)
    table = StepTable.from_tokens(
        [torch.randint(10, 150000, (args.prompt,), generator=g).tolist()
         for _ in range(args.samples)],
        [torch.randint(10, 150000, (args.completion,), generator=g).tolist()
         for _ in range(args.samples)],
        [[-1.0] * args.completion] * args.samples)
    adv = torch.randn(args.samples, generator=g).numpy()
    rows = []
    for name, extra in (("full", {}), ("lora_r16", {"lora_r": 16})):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        cfg = LearnerConfig(lr=1e-6, kl_coef=0.01, micro_batch_size=8, bf16=True,
                            gradient_checkpointing=True, **extra)
        learner = Learner(path, AutoTokenizer.from_pretrained(path), cfg)
        learner.update(table, adv)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            m = learner.update(table, adv)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
        rows.append({"mode": name, "update_s": round(t, 3),
                     "trained_tokens_per_s": round(m["train/tokens"] / t),
                     "all_tokens_per_s": round(args.samples * (args.prompt + args.completion) / t),
                     "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                     "gpu": torch.cuda.get_device_name()})
        print(json.dumps(rows[-1]), flush=True)
        del learner
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
