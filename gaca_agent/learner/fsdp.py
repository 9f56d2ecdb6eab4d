"""FSDP2 sharding of the policy and reference, their full state dicts, and gradient
clipping that works on sharded and plain models alike."""

from __future__ import annotations

from typing import Any

import torch


def decoder_layers(model) -> list[torch.nn.Module]:
    names = set(getattr(inner(model), "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def inner(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shard(model, bf16: bool) -> None:
    """FSDP2: each decoder layer, then the root (fp32 masters; bf16 compute if asked)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def full_state(model) -> dict[str, torch.Tensor]:
    """An FSDP2 module's full state dict on every rank (CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload would leave the other ranks with an empty dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu() for k, v in state.items()}


def fsdp_modules(model) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def clip_grad_norm(model, max_norm: float, sharded: bool, acc) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not sharded:
        return float(acc.clip_grad_norm_(model.parameters(), max_norm))
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
