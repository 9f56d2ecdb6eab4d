"""gaca-serve's end of the distributed weight update, in SGLang's form
(:mod:`gaca_agent.generate.transfer` has the protocol and the learner's end).

``init`` joins the learner's process group (gloo on a CPU server, NCCL on a GPU one);
``update`` receives one bucket by broadcast, with its tensors in SGLang's
``flattened_bucket`` layout or one broadcast per tensor, and loads it into the served
weights between two batches (the learner pauses generation around a whole update, so no
batch sees half of one); ``destroy`` leaves the group. Every collective is bounded by
``timeout_s``.
"""

from __future__ import annotations

import threading
from typing import Any

from gaca_agent.serving.protocol import APIError

TIMEOUT_S = 600.0


class Receiver:
    def __init__(self, weights, device: str, timeout_s: float = TIMEOUT_S) -> None:
        self.weights, self.device, self.timeout_s = weights, device, timeout_s
        self.groups: dict[str, Any] = {}
        self.lock = threading.Lock()  # one update at a time

    def init(self, body: Any) -> None:
        from gaca_agent.generate.transfer import process_group

        need = {"master_address": str, "master_port": int, "rank_offset": int,
                "world_size": int}
        if not isinstance(body, dict) or any(not isinstance(body.get(k), t)
                                             for k, t in need.items()):
            raise APIError(400, "give master_address, master_port, rank_offset and "
                                "world_size", "master_address")
        name = body.get("group_name") or "weight_update_group"
        backend = body.get("backend") or "nccl"
        if backend == "nccl" and not self.device.startswith("cuda"):
            raise APIError(400, "this gaca-serve runs on the CPU: its weight group takes "
                                "backend gloo", "backend")
        if name in self.groups:
            raise APIError(400, f"weight group {name!r} exists already; destroy it first",
                           "group_name")
        try:
            self.groups[name] = process_group(body["master_address"], body["master_port"],
                                              body["rank_offset"], body["world_size"], name,
                                              backend, self.timeout_s)
        except Exception as err:  # a rendezvous that failed: said, the server goes on
            raise APIError(400, f"cannot join weight group {name!r}: {type(err).__name__}: "
                                f"{err}", "master_address") from err

    def update(self, body: Any) -> None:
        from gaca_agent.generate.transfer import broadcast, unflatten

        if not isinstance(body, dict) or not all(isinstance(body.get(k), list)
                                                 for k in ("names", "dtypes", "shapes")):
            raise APIError(400, "give names, dtypes and shapes", "names")
        group = self.groups.get(body.get("group_name") or "weight_update_group")
        if group is None:
            raise APIError(400, "no weight group: POST /init_weights_update_group first",
                           "group_name")
        names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
        with self.lock, self.weights.replacing("names"):  # no batch while weights arrive
            try:
                named = self._receive(group, names, dtypes, shapes,
                                      body.get("load_format") == "flattened_bucket",
                                      broadcast, unflatten)
            except Exception as err:
                raise APIError(400, f"receiving the weights failed: {type(err).__name__}: "
                                    f"{err}", "names") from err
            self.weights.load(named, locked=True, version=body.get("weight_version"))

    def _receive(self, group, names, dtypes, shapes, flattened: bool, broadcast, unflatten):
        """The bucket's named tensors; a tensor that matches a served one (name, dtype,
        shape) is received straight into it (no copy)."""
        import math

        import torch

        if flattened:
            nbytes = sum(math.prod(s) * torch.empty((), dtype=getattr(torch, d)).element_size()
                         for d, s in zip(dtypes, shapes))
            flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            broadcast(flat, group, self.timeout_s)
            return unflatten(flat, names, dtypes, shapes)
        own = self.weights.engine.model.state_dict()
        out = []
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            kind, target = getattr(torch, dtype), own.get(name)
            if target is not None and target.dtype == kind and list(target.shape) == shape \
                    and target.is_contiguous():
                with torch.no_grad():
                    broadcast(target, group, self.timeout_s)
                continue  # already in place
            tensor = torch.empty(shape, dtype=kind, device=self.device)
            broadcast(tensor, group, self.timeout_s)
            out.append((name, tensor))
        return out

    def destroy(self, body: Any) -> None:
        from gaca_agent.generate.transfer import destroy

        name = (body or {}).get("group_name") if isinstance(body, dict) else None
        group = self.groups.pop(name or "weight_update_group", None)
        if group is None:
            raise APIError(400, "the group to be destroyed does not exist", "group_name")
        destroy(group)
