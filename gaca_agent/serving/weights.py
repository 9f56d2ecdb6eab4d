"""Full-weight updates while serving, in vLLM's and SGLang's forms, and pausing generation
around them.

vLLM (its RL endpoints, ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort|wait|keep``,
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``,
``POST /update_weight_version {"new_version"}``, ``POST /resume``, ``GET /weight_info``,
``GET /is_paused``, ``POST /weight_checker {"action": "checksum"}``. SGLang: ``POST /update_weights_from_disk {"model_path", "weight_version",
...}``, ``POST /update_weight_version``, ``GET /get_weight_version``, ``POST
/pause_generation``, ``POST /continue_generation``, and the distributed update
(:mod:`gaca_agent.serving.receiver`). ``DIR`` holds the model's safetensors
(``save_pretrained``); they replace the served base weights (cast to its dtype) between
two batches. Chat responses report the label: per token span with
``return_weight_versions`` (vLLM) and as ``metadata.weight_version`` (SGLang).

Pausing: no batch starts while generation is paused. ``keep`` (vLLM; SGLang's
``in_place`` and ``retract``) holds new requests until resume; ``wait`` refuses new ones
(503) and returns once the work already taken is done; ``abort`` refuses new ones and
answers the queued ones with 503 (a running batch finishes: gaca-serve cannot stop it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from gaca_agent.serving.protocol import APIError


class Weights:
    def __init__(self, engine, adapters) -> None:
        self.engine, self.adapters = engine, adapters
        self.version = "default"
        self.running = threading.Event()
        """Set while batches may run (cleared by a pause)."""
        self.running.set()
        self.refusing = False
        """Whether new chat requests are refused (503) during a pause."""

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    def pause(self, mode: str, batcher) -> None:
        if mode not in ("abort", "wait", "keep"):
            raise APIError(400, f"mode must be abort, wait or keep, got {mode!r}", "mode")
        self.refusing = mode != "keep"
        if mode == "wait":  # the work already taken runs to its end first
            deadline = time.monotonic() + 600
            while not batcher.idle() and time.monotonic() < deadline:
                time.sleep(0.01)
        self.running.clear()
        if mode == "abort":
            batcher.abort_queued(APIError(503, "aborted: generation was paused"))

    def resume(self) -> None:
        self.refusing = False
        self.running.set()

    def reload(self, path: str, version: str | None = None) -> None:
        """Load the safetensors under ``path`` into the base model (400 when they do not
        fit it; the served weights are then unchanged), labelled ``version`` when given
        (in the same step: no batch runs between the weights and their label)."""
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise APIError(400, f"no safetensors files under {path!r}", "weights_path")
        state: dict = {}
        for f in files:
            state.update(load_file(str(f)))
        self.load(state.items(), "weights_path", version=version)

    @contextlib.contextmanager
    def replacing(self, param: str = "names"):
        """Held while base weights are replaced: no batch runs (the adapters' lock), and a
        400 naming ``param`` while LoRA adapters are loaded."""
        with self.adapters.lock:
            if self.adapters.paths:
                raise APIError(400, "cannot replace the base weights while LoRA adapters are "
                                    "loaded; unload them first", param)
            yield

    def load(self, named, param: str = "names", locked: bool = False,
             version: str | None = None) -> None:
        """Copy named tensors into the base model (cast to its dtype), between two
        batches; 400 naming the first that does not fit (nothing is changed then).
        ``locked``: the caller is inside :meth:`replacing` already; ``version``: the new
        weights' label, set before the next batch can start."""
        import torch

        if version is not None:
            check_version(version)
        named = list(named)
        with contextlib.nullcontext() if locked else self.replacing(param):
            own = self.engine.model.state_dict()
            bad = [k for k, v in named if k not in own or own[k].shape != v.shape]
            if bad:
                raise APIError(400, f"{len(bad)} tensors do not fit the served model "
                                    f"(first: {bad[0]!r})", param)
            with torch.no_grad():
                for k, v in named:
                    own[k].copy_(v.to(own[k].dtype))
            if version is not None:
                self.version = version

    def checksums(self) -> dict[str, str]:
        """sha256 of each served tensor's bytes (vLLM's ``/weight_checker``)."""
        import hashlib

        import torch

        with self.adapters.lock:
            state = self.engine.model.state_dict()
            return {k: hashlib.sha256(v.detach().cpu().contiguous().view(-1)
                                      .view(torch.uint8).numpy()).hexdigest()
                    for k, v in state.items()}

    def set_version(self, version) -> None:
        self.version = check_version(version)


def check_version(version) -> str:
    if not isinstance(version, str) or not version:
        raise APIError(400, "new_version must be a non-empty string", "new_version")
    return version
