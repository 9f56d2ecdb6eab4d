"""SmolLM2-135M-Instruct on a CPU: one rollout step of 16 live ALFWorld episodes and one
update on its 16 step rows, for today's path, fp32 and bf16, side by side in one process.

The turns are real: 16 valid_seen games played 2 random steps, so each prompt is the
chat-templated ALFWorld prompt with a history of 2 (GiGPO's), about 700 tokens. A
rollout step is the one engine call the collector makes for all live episodes
(``HFPolicy.act``: batched, KV cache, keyed sampling, up to ``--max-new-tokens`` at
temperature 1). An update is ``Learner.update`` on the 16 rows that step produced.

- ``today``: what ``gaca_agent/configs/smollm2_lora_cpu.yaml`` runs: fp32 weights for the
  rollout; LoRA r=8 with KL to the base (0.01) for the update.
- ``fp32``: fp32 rollout; full fine-tuning, no KL.
- ``bf16-autocast``: generation under bf16 autocast on the fp32 weights (what a GPU does).
- ``bf16``: ``learner.bf16`` on a CPU: rollouts on the learner's bf16 copy of the
  weights; the update under bf16 autocast over fp32 masters; full fine-tuning, no KL.
- ``bf16-new``: ``bf16`` with what 2026-12-06 added (on by default since): the prompts
  prefilled without repeats or padding (shared prefixes computed once, the rest in
  buckets of similar lengths: :mod:`gaca_agent.generate.prefix`) and micro-batches of
  rows of similar length in the update (:func:`gaca_agent.learner.batch.micro_batches`).
  The other paths run with both off, as they ran before.

``--group-size G`` plays the episodes in groups of G of one game (as RL does; 1: 16
games), so a group's prompts share the task and its first observations.

The bf16 paths pay only on a CPU that multiplies bf16 natively (AVX512-BF16 or AMX;
``benchmarks/bench_bf16_matmul.py`` says whether this one does): elsewhere they measure
PyTorch's reference kernel, 8-9x slower than fp32.

Each measurement is the median of ``--repeats`` after one warm-up call; rollout tokens/s
count generated tokens (the ratios use all tokens, prompt + generated, a second: the
paths sample responses of different lengths), update tokens/s all tokens of the rows.
Each path's ``rollout_logprob_gap`` is the mean absolute gap between the rollout's
log-probs and the learner's recomputation of them in its first update (same weights).

    python benchmarks/bench_cpu_lm.py [--threads 2] [--repeats 2] [--group-size 1]
        [--paths today,fp32,bf16-autocast,bf16,bf16-new] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


class Recorder:
    """Random admissible actions; keeps the turns it saw at ``step``."""

    needs_expert = False

    def __init__(self, step: int) -> None:
        import random

        self.step, self.turns, self.rng = step, [], random.Random(0)

    def act(self, turns):
        from gaca_agent.generate.prompts import format_response
        from gaca_agent.types import ActionOutput

        self.turns += [t for t in turns if t.step == self.step]
        out = []
        for t in turns:
            a = self.rng.choice([x for x in t.admissible_actions if x != "help"])
            out.append(ActionOutput(format_response(a), a, True))
        return out


def live_turns(episodes: int, history: int, group_size: int = 1):
    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection

    policy = Recorder(history)
    collector = Collector(EnvSection(id="gaca/ALFWorld-v0", kwargs={
        "split": "valid_seen", "max_episode_steps": history + 1}, max_live_envs=episodes,
        workers=0, history_length=history))
    try:
        collector.run(policy, [(k * 7 % 140, k) for k in range(episodes // group_size)],
                      group_size)
    finally:
        collector.close()
    return policy.turns[:episodes]


def timed(call, repeats: int):
    """(median seconds of ``repeats`` calls after a warm-up call, the warm-up's result,
    the last result)."""
    first = call()
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first, out


def learner_for(path, tokenizer, **kw):
    import torch
    from accelerate import Accelerator

    from gaca_agent.learner.config import LearnerConfig
    from gaca_agent.learner.core import Learner

    torch.manual_seed(0)
    cfg = LearnerConfig(**{"lr": 1e-5, "kl_coef": 0.0, "micro_batch_size": 4,
                           "old_logprobs": "recompute", "temperature": 1.0, **kw})
    return Learner(path, tokenizer, cfg, Accelerator(cpu=True))


def rollout(learner, tokenizer, turns, args, autocast: bool = False):
    from gaca_agent.policies.hf import HFPolicy

    policy = HFPolicy(learner.rollout_model, tokenizer, 1.0, args.max_new_tokens,
                      history_length=2, device="cpu")
    seconds, _, outs = timed(lambda: rollout_call(learner, policy, turns, autocast),
                             args.repeats)
    tokens = sum(len(o.completion_ids) for o in outs)
    prompt = sum(len(o.prompt_ids) for o in outs)
    return {"seconds": round(seconds, 2), "generated_tokens": tokens,
            "prompt_tokens": prompt, "tokens_per_s": round(tokens / seconds, 1),
            "all_tokens_per_s": round((tokens + prompt) / seconds, 1)}, outs


def rollout_call(learner, policy, turns, autocast: bool):
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast \
            else learner.rollout_context():
        return policy.act(turns)


#: Each path: the learner's settings, generation under autocast, 2026-12-06's additions.
PATHS = {"today": ({"lora_r": 8, "lora_alpha": 16, "kl_coef": 0.01, "lr": 1e-4}, False, False),
         "fp32": ({}, False, False), "bf16-autocast": ({}, True, False),
         "bf16": ({"bf16": True}, False, False), "bf16-new": ({"bf16": True}, False, True)}


def use_additions(on: bool) -> None:
    """2026-12-06's prefill (:mod:`gaca_agent.generate.prefix`) and micro-batches by
    length on, or both off (the earlier paths, as they ran)."""
    from gaca_agent.generate import prefix
    from gaca_agent.learner import batch, core

    prefix.ENABLED = on
    core.micro_batches = batch.micro_batches if on else (
        lambda rows, size, target, lengths=None: batch.micro_batches(rows, size, target))


def update(learner, outs, args):
    import numpy as np

    from gaca_agent.steps import StepTable

    table = StepTable.from_tokens([o.prompt_ids for o in outs],
                                  [o.completion_ids for o in outs],
                                  [o.logprobs for o in outs])
    adv = np.random.default_rng(0).normal(size=len(outs))
    seconds, first, _ = timed(lambda: learner.update(table, adv), args.repeats)
    tokens = sum(len(o.prompt_ids) + len(o.completion_ids) for o in outs)
    # the first update recomputes with the weights that sampled the rows
    return {"seconds": round(seconds, 2), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
            "rollout_logprob_gap": round(first["train/rollout_logprob_gap"], 5)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = args.paths.split(",")
    if "today" not in names or not set(names) <= set(PATHS):
        parser.error(f"--paths: today and any of {list(PATHS)}")
    import torch
    from transformers import AutoTokenizer

    from gaca_agent.policies.smollm2 import smollm2_path

    torch.set_num_threads(args.threads)
    path = str(smollm2_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    turns = live_turns(args.episodes, 2, args.group_size)
    report: dict = {"episodes": len(turns), "group_size": args.group_size,
                    "threads": args.threads, "max_new_tokens": args.max_new_tokens}
    for name in names:
        kw, autocast, new = PATHS[name]
        use_additions(new)
        learner = learner_for(path, tokenizer, **kw)
        row, outs = rollout(learner, tokenizer, turns, args, autocast)
        report[name] = {"rollout": row}
        if name != "bf16-autocast":  # its update is bf16's
            report[name]["update"] = update(learner, outs, args)
        print(name, json.dumps(report[name]), flush=True)
        del learner
    for name in [n for n in names if n != "today"]:
        r = report[name]
        # all tokens (prompt + generated) a second: the paths sample different lengths
        r["rollout_vs_today"] = round(r["rollout"]["all_tokens_per_s"]
                                      / report["today"]["rollout"]["all_tokens_per_s"], 2)
        if "update" in r:
            r["update_vs_today"] = round(r["update"]["tokens_per_s"]
                                         / report["today"]["update"]["tokens_per_s"], 2)
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
