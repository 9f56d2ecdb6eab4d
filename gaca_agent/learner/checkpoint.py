"""Loading a model as fp32 masters, the RNG states a checkpoint keeps, and the learner's
saving and restoring (:class:`Checkpoints`, a part of :class:`~gaca_agent.learner.core.
Learner`)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gaca_agent.learner.fsdp import full_state


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


class Checkpoints:
    """The :class:`~gaca_agent.learner.core.Learner`'s weights and states on disk (it
    provides ``model``, ``unwrapped``, ``accelerator``, ``config``, ``sharded``,
    ``tokenizer``, ``optimizer``, ``scheduler`` and ``steps``)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) model state on every rank's CPU."""
        if not self.sharded:
            return {k: v.detach().cpu() for k, v in self.unwrapped.state_dict().items()}
        return full_state(self.model)

    def save_adapter(self, path: str | Path) -> None:
        """The LoRA adapter alone (peft's files), as an inference server loads it."""
        if self.config.lora_r <= 0:
            raise ValueError("save_adapter needs a LoRA learner (lora_r > 0)")
        weights = self.state_dict() if self.sharded else None
        if self.accelerator.is_main_process:
            self.unwrapped.save_pretrained(Path(path), state_dict=weights)
        self.accelerator.wait_for_everyone()

    def save_weights(self, path: str | Path, dtype: str = "float32") -> None:
        """The full model as an inference server loads it from disk (config and
        safetensors, in ``dtype``), for the full-weight sync."""
        if self.config.lora_r > 0:
            raise ValueError("save_weights is for full fine-tuning; save_adapter for LoRA")
        state = self.state_dict()
        if self.accelerator.is_main_process:
            cast = getattr(torch, dtype)
            state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
            self.unwrapped.save_pretrained(Path(path), state_dict=state)
        self.accelerator.wait_for_everyone()

    def full_weights(self, dtype: str = "float32") -> list[tuple[str, torch.Tensor]]:
        """The full model's named tensors (CPU; floating ones in ``dtype``), as the
        inference server loads them: the broadcast weight sync's payload."""
        cast = getattr(torch, dtype)
        return [(k, v.to(cast) if v.is_floating_point() else v)
                for k, v in self.state_dict().items()]

    def save(self, path: str | Path) -> None:
        """Model (or adapter), tokenizer, optimizer, scheduler and RNG states. Under
        ``fsdp`` each rank writes its optimizer shard."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        acc = self.accelerator
        self.save_model(path / "model")
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "steps": self.steps, "rng": rng_state()}
        if self.sharded:
            torch.save(state, path / f"trainer_state.rank{acc.process_index}.pt")
        elif acc.is_main_process:
            torch.save(state, path / "trainer_state.pt")
        acc.wait_for_everyone()

    def save_model(self, path: str | Path) -> None:
        """The policy as a transformers folder (with its tokenizer): ``model.path``,
        ``gaca-eval --policy hf:PATH`` and ``gaca-serve`` read it; under LoRA, the adapter."""
        weights = self.state_dict() if self.sharded else None
        if self.accelerator.is_main_process:
            self.unwrapped.save_pretrained(Path(path), state_dict=weights)
            self.tokenizer.save_pretrained(Path(path))
        self.accelerator.wait_for_everyone()

    def load_state(self, path: str | Path) -> None:
        """Restore optimizer, scheduler and RNG (the weights are loaded at construction)."""
        name = (f"trainer_state.rank{self.accelerator.process_index}.pt" if self.sharded
                else "trainer_state.pt")
        state = torch.load(Path(path) / name, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        set_rng_state(state["rng"])

