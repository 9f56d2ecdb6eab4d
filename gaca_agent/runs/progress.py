"""What a run says while it runs: our own progress bars only (the libraries' loading and
saving bars are silenced under them), and one plain line per iteration when there is no
bar (``--no-progress``, or output that is not a terminal: a job under a scheduler)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Callable, Iterator, Mapping


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
    """``NAME iteration 3/8: rollout success 0.250, eval success 0.500, groups alike 75%,
    policy loss -0.0123, kl 0.0004, 12.3 s`` (the evaluation only on iterations that ran
    one). "Groups alike" is the share of task groups whose episodes all returned the same
    (no episode-level advantage); when it is every group, a second line says so."""
    parts = [f"rollout success {metrics.get('rollout/success', math.nan):.3f}"]
    if "eval/success" in metrics:
        parts.append(f"eval success {metrics['eval/success']:.3f}")
    alike = metrics.get("adv/zero_variance_groups")
    if alike is not None:
        parts.append(f"groups alike {alike:.0%}")
    for key, label in (("losses/policy", "policy loss"), ("losses/kl", "kl")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.4g}")
    line = f"{name} iteration {it + 1}/{total}: {', '.join(parts)}, {seconds:.1f} s"
    if alike == 1.0:
        line += ("\n  every task group's episodes returned alike: no episode-level advantage "
                 "this iteration (step-level terms see only how long they took); sample at "
                 "a higher model.temperature, or larger or harder groups")
        if metrics.get("train/filtered_rows_frac") == 1.0:
            line += " (algo.filter_groups left every row out: no update)"
    return line


@contextlib.contextmanager
def warmup_progress(name: str, steps: int, bar: bool) -> Iterator[Callable[[int, float], None]]:
    """An ``on_step(step, loss)`` for the warm-up's steps: a bar, or (no bar) a plain line
    ``NAME warm-up step 8/80: loss 1.234, 95.1 s`` at every tenth of the steps."""
    from tqdm import tqdm

    shown = tqdm(total=steps, desc=f"{name} warm-up", disable=not bar)
    start, every = time.perf_counter(), max(1, steps // 10)

    def on_step(step: int, loss: float) -> None:
        shown.update(1)
        shown.set_postfix(loss=f"{loss:.3f}")
        if not bar and (step % every == 0 or step == steps):
            print(f"{name} warm-up step {step}/{steps}: loss {loss:.3f}, "
                  f"{time.perf_counter() - start:.1f} s", file=sys.stdout, flush=True)

    try:
        yield on_step
    finally:
        shown.close()


def warmup_line(name: str, metrics: Mapping[str, float]) -> str:
    """``NAME warm-up: loss 1.69 -> 0.21, eval success 0.125 (zero-shot 0.000)``: what the
    warm-up row holds (the parts it has)."""
    parts = []
    if "warmup/first_loss" in metrics:
        parts.append(f"loss {metrics['warmup/first_loss']:.3f} -> "
                     f"{metrics['warmup/last_loss']:.3f}")
    if "eval/success" in metrics:
        zero = metrics.get("eval_before/success")
        parts.append(f"eval success {metrics['eval/success']:.3f}"
                     + ("" if zero is None else f" (zero-shot {zero:.3f})"))
    return f"{name} warm-up: {', '.join(parts) or 'done'}"

