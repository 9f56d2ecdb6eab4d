"""Run under ``accelerate launch`` / ``torchrun`` (2 processes, gloo) by the distributed
tests: the learner with unequal shares (rank 0: 7 rows, rank 1: 1 row), generation of
different lengths on each rank inside ``rollout_context``, then one more update; writes
each rank's digest of the full parameters and its metrics to OUT.rankR.json.

    python dist_probe.py MODEL_PATH OUT '{"fsdp": true, ...LearnerConfig fields}'
"""

import json
import sys

import numpy as np
import torch


def main() -> None:
    path, out, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.learner.core import Learner, LearnerConfig
    from gaca_agent.generate.engines import HFEngine, Request
    from gaca_agent.steps import StepTable
    from gaca_agent.training.ranks import param_digest

    torch.set_num_threads(1)
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    tok = AutoTokenizer.from_pretrained(path)
    cfg = LearnerConfig(**{"lr": 1e-2, "kl_coef": 0.05, "micro_batch_size": 2, **overrides})
    learner = Learner(path, tok, cfg, acc)
    rank = acc.process_index
    n = 7 if rank == 0 else 1
    rng = np.random.default_rng(rank)
    prompts = [rng.integers(10, len(tok), 5 + i).tolist() for i in range(n)]
    comps = [rng.integers(10, len(tok), 2 + i % 3).tolist() for i in range(n)]
    table = StepTable.from_tokens(prompts, comps, [[-1.0] * len(c) for c in comps])
    metrics = [learner.update(table, rng.normal(size=n))]
    engine = HFEngine(learner.unwrapped, tok, acc.device)
    requests = [Request(tuple(p), 16 if rank == 0 else 4, 1.0, key=i)
                for i, p in enumerate(prompts[: 3 if rank == 0 else 1])]
    with learner.rollout_context():  # ranks generate different numbers of tokens
        completions = engine.generate(requests)
    metrics.append(learner.update(table, rng.normal(size=n)))
    trainable = {k for k, p in learner.unwrapped.named_parameters() if p.requires_grad}
    state = learner.state_dict()
    digest = param_digest({k: v for k, v in state.items() if k in trainable})
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"digest": digest, "metrics": metrics, "sharded": learner.sharded,
                   "generated": [len(c.completion_ids) for c in completions]}, f)
    acc.wait_for_everyone()
    # destroy the process group while the interpreter is whole: a gloo group left to the
    # interpreter's finalisation can abort the process (SIGABRT, "terminate called without
    # an active exception"), as rank 0 did once in 7 runs of the suite
    acc.end_training()


if __name__ == "__main__":
    main()
