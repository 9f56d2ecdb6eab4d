"""What the learner's rollouts generate with: its policy (under FSDP2 with the full
parameters gathered; under ``learner.bf16`` with autocast), or a bf16 copy on a CPU.

The update runs under bf16 autocast over fp32 master weights (an update of 1e-6 is not
rounded away). Generation under autocast casts every weight at every call, which in
token-by-token decoding costs about as much as the decoding itself; on a CPU with bf16
matmuls (AMX, AVX512-BF16) rollouts therefore run on a bf16 copy of the weights,
refreshed from the masters before each rollout. Its weights are autocast's casts (the
same rounding), so the rollout's log-probs differ from the learner's recomputation only
by where the two round activations (docs/benchmarks.md states the measured gap; with
``learner.old_logprobs: recompute`` the update uses its own). On a GPU, and under FSDP2,
generation keeps autocast on the masters.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from gaca_agent.learner.fsdp import fsdp_modules


class RolloutCopy:
    """A bf16, gradient-free copy of ``master`` for generation; :meth:`refresh` copies
    the masters' current values into it (in place: policies holding it see them)."""

    def __init__(self, master) -> None:
        self.model = copy.deepcopy(master).to(torch.bfloat16).eval().requires_grad_(False)
        self.model.config.use_cache = True  # gradient checkpointing turned it off

    def refresh(self, master) -> None:
        own = self.model.state_dict()
        with torch.no_grad():
            for name, value in master.state_dict().items():
                own[name].copy_(value)


def wanted(bf16: bool, sharded: bool, device: torch.device) -> bool:
    """Whether a learner with these settings rolls out on a bf16 copy."""
    return bf16 and not sharded and device.type == "cpu"


@contextlib.contextmanager
def rollout_context(learner):
    """Around generation with ``learner.rollout_model``: the bf16 copy refreshed from the
    current weights; or, under FSDP2, every rank gathers the full parameters once
    (forwards then run without collectives, so ranks may generate different numbers of
    tokens) and reshards after; else bf16 autocast when configured."""
    if learner.rollout_copy is not None:
        learner.rollout_copy.refresh(learner.unwrapped)
        yield
        return
    if not learner.sharded:
        with learner.autocast():
            yield
        return
    modules = fsdp_modules(learner.model)
    for m in modules:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()
