"""The learner's accelerate handle, with its precision left to the learner.

The learner casts itself (``learner.bf16``: bf16 autocast or FSDP2's param dtype over fp32
masters). accelerate's process-wide state would add a second autocast of its own once any
earlier ``Accelerator`` in the process set ``mixed_precision`` (TRL's trainers default to
bf16), silently changing the update: that is refused here instead.
"""

from __future__ import annotations

from typing import Any

MIXED = ("the learner sets its own precision (learner.bf16), but accelerate in this process "
         "already autocasts to {mp}: an earlier Accelerator (a TRL or transformers trainer) "
         "or the one handed in set it. Use learner.bf16 instead, with a fresh process or an "
         "Accelerator(mixed_precision='no')")


def make_accelerator() -> Any:
    """An ``Accelerator`` without mixed precision, on the GPU when there is one."""
    import torch
    from accelerate import Accelerator

    try:
        return Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no")
    except ValueError as e:
        if "already been initialized" not in str(e):
            raise
        from accelerate.state import AcceleratorState

        raise ValueError(MIXED.format(mp=AcceleratorState().mixed_precision)) from None


def check_precision(accelerator: Any) -> None:
    """Refuse an accelerator that would autocast the learner's forward passes itself."""
    if accelerator.mixed_precision != "no":
        raise ValueError(MIXED.format(mp=accelerator.mixed_precision))
