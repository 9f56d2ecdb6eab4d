"""Loading a model as fp32 masters, and the RNG states a checkpoint keeps."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch


def load_fp32(model):
    """A model object in fp32 (fp32 masters) from a path or an object."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        model = model.float()
    return model


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
