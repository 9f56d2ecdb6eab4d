"""What a run says while it runs: our own progress bars only (the libraries' loading and
saving bars are silenced under them), and one plain line per iteration when there is no
bar (``--no-progress``, or output that is not a terminal: a job under a scheduler)."""

from __future__ import annotations

import math
from typing import Mapping


def quiet_libraries() -> None:
    """Silence transformers' and the Hub's own progress bars ("Loading weights", "Writing
    model shards"), which would break into ours."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def iteration_line(name: str, it: int, total: int, metrics: Mapping[str, float],
                   seconds: float) -> str:
    """``NAME iteration 3/8: rollout success 0.250, eval success 0.500, policy loss
    -0.0123, kl 0.0004, 12.3 s`` (the evaluation only on iterations that ran one)."""
    parts = [f"rollout success {metrics.get('rollout/success', math.nan):.3f}"]
    if "eval/success" in metrics:
        parts.append(f"eval success {metrics['eval/success']:.3f}")
    for key, label in (("losses/policy", "policy loss"), ("losses/kl", "kl")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.4g}")
    return f"{name} iteration {it + 1}/{total}: {', '.join(parts)}, {seconds:.1f} s"
