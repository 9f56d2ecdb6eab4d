"""Full-weight updates from disk while serving, in vLLM's and SGLang's forms.

vLLM (its RL endpoints, ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort|wait|keep``,
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``,
``POST /update_weight_version {"new_version"}``, ``POST /resume``, ``GET /weight_info``,
``GET /is_paused``. SGLang: ``POST /update_weights_from_disk {"model_path", "weight_version",
...}``, ``POST /update_weight_version``, ``GET /get_weight_version``. ``DIR`` holds the
model's safetensors (``save_pretrained``); they replace the served base weights (cast to
its dtype) between two batches. Chat responses report the label: per token span with
``return_weight_versions`` (vLLM) and as ``metadata.weight_version`` (SGLang).
"""

from __future__ import annotations

import threading
from pathlib import Path

from gaca_agent.serving.protocol import APIError


class Weights:
    def __init__(self, engine, adapters) -> None:
        self.engine, self.adapters = engine, adapters
        self.version = "default"
        self.paused = threading.Event()

    def reload(self, path: str) -> None:
        """Load the safetensors under ``path`` into the base model (400 when they do not
        fit it; the served weights are then unchanged)."""
        import torch
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise APIError(400, f"no safetensors files under {path!r}", "weights_path")
        state: dict = {}
        for f in files:
            state.update(load_file(str(f)))
        with self.adapters.lock:  # waits for the running batch
            if self.adapters.paths:
                raise APIError(400, "cannot replace the base weights while LoRA adapters are "
                                    "loaded; unload them first", "weights_path")
            model = self.engine.model
            own = model.state_dict()
            bad = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
            if bad:
                raise APIError(400, f"{len(bad)} tensors under {path!r} do not fit the served "
                                    f"model (first: {bad[0]!r})", "weights_path")
            with torch.no_grad():
                for k, v in state.items():
                    own[k].copy_(v.to(own[k].dtype))

    def set_version(self, version) -> None:
        if not isinstance(version, str) or not version:
            raise APIError(400, "new_version must be a non-empty string", "new_version")
        self.version = version
