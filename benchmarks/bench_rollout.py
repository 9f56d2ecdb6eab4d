"""Rollout throughput of the two engines, side by side: ``hf`` (transformers generate,
keyed per-row sampling) vs ``paged`` (transformers continuous batching, paged KV cache).

ALFWorld valid_seen, ``--episodes`` tasks played at once, each cut at ``--turns`` steps,
responses of up to ``--max-new-tokens`` tokens at temperature 1 (random-length responses:
the untrained tiny model and SmolLM2-135M-Instruct stop at different points). For each
model the two engines play the same episodes one after the other in this process, after
a warm-up call each. Reports env steps/s and generated tokens/s.

    python benchmarks/bench_rollout.py [--episodes 8] [--turns 4] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run(model, tokenizer, engine: str, tasks, args) -> dict:
    from gaca_agent.policies.hf import HFPolicy
    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection

    policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=args.max_new_tokens,
                      device="cpu", engine=engine)
    kwargs = {"split": "valid_seen", "max_episode_steps": args.turns}
    collector = Collector(EnvSection(id="gaca/ALFWorld-v0", kwargs=kwargs,
                                     max_live_envs=len(tasks), invalid_penalty=0.0))
    try:
        collector.run(policy, tasks[:2], 1)  # warm-up: workers, engine, caches
        start = time.perf_counter()
        rollout = collector.run(policy, tasks, 1)
        elapsed = time.perf_counter() - start
    finally:
        collector.close()
    table = rollout.table
    tokens = int(table["completion_ids"].lengths().sum())
    return {"engine": engine, "seconds": round(elapsed, 2), "env_steps": len(table),
            "generated_tokens": tokens, "env_steps_per_s": round(len(table) / elapsed, 2),
            "tokens_per_s": round(tokens / elapsed, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--models", default="tiny,smollm2")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tasks = [(k * 17 % 140, k) for k in range(args.episodes)]
    report = {}
    for name in args.models.split(","):
        if name == "tiny":
            from gaca_agent.policies.tiny_model import cached_tiny_model

            path = str(cached_tiny_model(0))
        else:
            from gaca_agent.policies.smollm2 import smollm2_path

            path = str(smollm2_path())
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        rows = [run(model, tokenizer, engine, tasks, args) for engine in ("hf", "paged")]
        report[name] = {"hf": rows[0], "paged": rows[1],
                        "paged_vs_hf_tokens_per_s": round(rows[1]["tokens_per_s"]
                                                          / rows[0]["tokens_per_s"], 2)}
        print(name, json.dumps(report[name]), flush=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
