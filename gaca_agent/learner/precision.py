"""Whether a device computes bf16 natively, and what ``learner.bf16`` becomes on it.

bf16 pays only where the hardware multiplies bf16: GPUs since Ampere, and CPUs with
AVX512-BF16 or AMX (Intel since Cooper Lake and Sapphire Rapids; AMD since Zen 4).
Elsewhere PyTorch computes bf16 matrix products on a reference kernel: on an AVX2 CPU
(AMD EPYC, 2 cores) a 512 x 576 x 1536 product ran at 18-19 GFLOP/s in bf16 against
155-162 in fp32 (``benchmarks/bench_bf16_matmul.py``), so a bf16 run there is several
times slower than an fp32 one, not faster. ``learner.bf16: auto`` takes bf16 only where
it is native.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path


@functools.lru_cache(maxsize=None)
def cpu_has_bf16() -> bool:
    """The CPU multiplies bf16 natively (oneDNN's own check; else the CPU flags)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        pass
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16(device) -> bool:
    """Whether ``device`` (a torch device) computes bf16 natively."""
    import torch

    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_has_bf16()
    return True  # other accelerators (mps, xpu): their own kernels decide


def warn_if_slow(device, asked: str, fix: str) -> None:
    """Warn that bf16 (``asked``: what asked for it) is slow on ``device`` when the device
    does not compute it natively, naming ``fix``."""
    if native_bf16(device):
        return
    kind, need = ("GPU", "Ampere or later") if device.type == "cuda" else \
        ("CPU", "AVX512-BF16 or AMX")
    warnings.warn(f"{asked} on a {kind} with no bf16 matrix units (without {need}): PyTorch "
                  "multiplies bf16 on a reference kernel there, many times slower than "
                  f"fp32; {fix}", stacklevel=3)


def resolve_bf16(setting: bool | str, device) -> bool:
    """``learner.bf16`` on ``device``: ``auto`` is bf16 where it is native; ``true`` stays
    bf16 everywhere (tests keep bf16 paths reachable on any CPU), with a warning where it
    is not native."""
    if setting == "auto":
        return native_bf16(device)
    if setting:
        warn_if_slow(device, "learner.bf16: true", "set learner.bf16=false (or auto, which "
                     "takes bf16 only where it is native)")
    return bool(setting)
