"""An update with rows alike forwarded once against one that forwards every row, on a
real iteration's rows, side by side in one process.

A run kept with ``keep_rollouts=tokens`` holds each step's prompt and answer token ids,
sampled log-probs and advantage (``rollouts/iter-NNNNN.rank0.jsonl.gz``). This times
``Learner.update`` on the first ``--groups`` task groups of one iteration twice, from the
same weights and with the run's learner settings: as the learner runs (rows of the same
prompt and answer ids share one forward pass, :func:`gaca_agent.learner.batch.
identical_rows`) and with every row forwarded on its own (the learner before 2026-12-07).

    python benchmarks/bench_shared_rows.py RUN --model RUN/warmup [--iteration 0]
        [--groups 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path


def iteration_rows(run: Path, iteration: int, groups: int):
    """(prompts, answers, sampled log-probs, advantages) of the first ``groups`` task
    groups' steps with an answer."""
    path = run / "rollouts" / f"iter-{iteration:05d}.rank0.jsonl.gz"
    with gzip.open(path, "rt") as f:
        episodes = [json.loads(line) for line in f]
    keep = sorted({e["group"] for e in episodes})[:groups]
    rows = ([], [], [], [])
    for e in episodes:
        for step in e["trajectory"] if e["group"] in keep else ():
            if "response_ids" not in step:
                raise SystemExit(f"{path} has no token ids: train with keep_rollouts=tokens")
            if step["response_ids"]:
                for column, value in zip(rows, (step["prompt_ids"], step["response_ids"],
                                                step["logprobs"], step.get("advantage", 0.0))):
                    column.append(value)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--iteration", type=int, default=0)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import dataclasses

    import numpy as np
    import torch
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.config import load_config
    from gaca_agent.learner import core
    from gaca_agent.learner.core import Learner
    from gaca_agent.steps import StepTable

    torch.set_num_threads(args.threads)
    cfg = load_config(args.run / "config.yaml")
    settings = dataclasses.replace(cfg.learner, temperature=cfg.model.temperature)
    prompts, answers, logprobs, adv = iteration_rows(args.run, args.iteration, args.groups)
    table = StepTable.from_tokens(prompts, answers, logprobs)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    report: dict = {"rows": len(prompts), "groups": args.groups,
                    "tokens": int(sum(len(p) + len(a) for p, a in zip(prompts, answers)))}
    shared = core.identical_rows
    for name in ("each", "shared"):
        core.identical_rows = shared if name == "shared" else (
            lambda data, rows: {int(i): np.asarray([i]) for i in rows})
        torch.manual_seed(0)
        learner = Learner(args.model, tokenizer, settings, Accelerator(cpu=True))
        start = time.perf_counter()
        metrics = learner.update(table, np.asarray(adv, dtype=np.float64))
        report[name] = {"seconds": round(time.perf_counter() - start, 1),
                        "shared_rows_frac": round(metrics["train/shared_rows_frac"], 3),
                        "policy_loss": metrics["losses/policy"], "kl": metrics["losses/kl"]}
        print(name, json.dumps(report[name]), flush=True)
        del learner
    core.identical_rows = shared
    report["speedup"] = round(report["each"]["seconds"] / report["shared"]["seconds"], 2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
