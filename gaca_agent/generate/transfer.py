"""Full weights from the learner to an inference server over ``torch.distributed``, not
disk (``server.weight_transfer: broadcast``): both ends of SGLang's protocol.

SGLang's API (gaca-serve speaks it too):

- ``POST /init_weights_update_group {master_address, master_port, rank_offset: 1,
  world_size: 2, group_name, backend}``: the server joins a process group of its own with
  the learner, which is rank 0 (both enter the rendezvous at once);
- ``POST /update_weights_from_distributed {names, dtypes, shapes, group_name,
  weight_version, flush_cache}``: the server receives the listed tensors, one broadcast
  each from rank 0 in that order, while the learner broadcasts them; one call per bucket
  of ``server.bucket_mb`` (``load_format: "flattened_bucket"``, one broadcast of the
  tensors' bytes concatenated, is taken too);
- ``POST /destroy_weights_update_group {group_name}``.

The group is made as SGLang makes its own (a TCP rendezvous, ``group_name`` as the store
prefix), so the learner's end meets a real SGLang server's. Every collective is bounded
by ``timeout_s``: a peer that never sends or receives stops the sync with one line
(:class:`~gaca_agent.generate.http.WeightSyncError`), never a hang. NCCL on GPUs, gloo on
CPUs.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

from gaca_agent.generate.http import WeightSyncError


def process_group(address: str, port: int, rank: int, world_size: int, group_name: str,
                  backend: str, timeout_s: float):
    """A process group of its own (not torch's default one) through a TCP rendezvous at
    ``address:port``: what SGLang's ``init_custom_process_group`` makes."""
    from torch.distributed.distributed_c10d import (Backend, PrefixStore,
                                                    _new_process_group_helper, _world,
                                                    rendezvous)

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{address}:{port}", rank, world_size,
                                              timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend),
                                      PrefixStore(group_name, store), group_name=group_name,
                                      timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy(group) -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(group)
    except Exception:  # noqa: BLE001 - already torn down by a failed peer
        pass


def buckets(named: list[tuple[str, Any]], bucket_bytes: int) -> list[list[tuple[str, Any]]]:
    """Consecutive tensors in buckets of at most ``bucket_bytes`` (a larger tensor: alone)."""
    out: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if out[-1] and size + nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append((name, tensor))
        size += nbytes
    return [b for b in out if b]


def flatten(bucket: list[tuple[str, Any]]):
    """(one uint8 tensor of the tensors' bytes, names, dtype names, shapes): SGLang's
    ``flattened_bucket`` layout."""
    import torch

    flat = torch.cat([t.detach().contiguous().flatten().view(torch.uint8) for _, t in bucket])
    return (flat, [n for n, _ in bucket], [str(t.dtype).split(".")[-1] for _, t in bucket],
            [list(t.shape) for _, t in bucket])


def unflatten(flat, names: list[str], dtypes: list[str], shapes: list[list[int]]):
    """The named tensors of a flattened bucket (views into ``flat``)."""
    import math

    import torch

    out, at = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        kind = getattr(torch, dtype)
        nbytes = math.prod(shape) * torch.empty((), dtype=kind).element_size()
        out.append((name, flat[at:at + nbytes].view(kind).reshape(shape)))
        at += nbytes
    if at != flat.numel():
        raise ValueError(f"the bucket holds {flat.numel()} bytes, its tensors {at}")
    return out


def broadcast(tensor, group, timeout_s: float) -> None:
    """``tensor`` from rank 0 to the group, bounded by ``timeout_s`` (raises on a peer
    that does not take part)."""
    import torch.distributed as dist

    work = dist.broadcast(tensor, src=0, group=group, async_op=True)
    if not work.wait(datetime.timedelta(seconds=timeout_s)):
        raise TimeoutError(f"the broadcast did not finish within {timeout_s:g} s")


class Broadcaster:
    """The learner's end for one server (its :class:`ServerEngine`): open the group once,
    then :meth:`send` full weights every sync."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0,
                 backend: str = "gloo", timeout_s: float = 600.0,
                 bucket_bytes: int = 1 << 30, group_name: str = "gaca_weights") -> None:
        self.engine, self.host, self.port, self.backend = engine, host, port, backend
        self.timeout_s, self.bucket_bytes, self.group_name = timeout_s, bucket_bytes, group_name
        self.group = None

    def _both(self, server_call, own_part, what: str):
        """``server_call`` (an HTTP request) on a thread while ``own_part`` runs here:
        both ends of a collective; any failure stops with one line."""
        outcome: dict[str, Any] = {}

        def call():
            try:
                outcome["reply"] = server_call()
            except BaseException as err:  # noqa: BLE001 - reported below
                outcome["error"] = err

        thread = threading.Thread(target=call, name="gaca-weight-request", daemon=True)
        thread.start()
        try:
            result = own_part()
        except Exception as err:
            thread.join(timeout=1.0)
            cause = outcome.get("error", err)
            raise WeightSyncError(f"{what} failed: {type(cause).__name__}: {cause} (every "
                                  f"collective is bounded by server.transfer_timeout_s = "
                                  f"{self.timeout_s:g} s)") from err
        thread.join(timeout=self.timeout_s)
        if thread.is_alive() or "error" in outcome:
            cause = outcome.get("error", TimeoutError(f"no answer in {self.timeout_s:g} s"))
            raise WeightSyncError(f"{what} failed on the server: {type(cause).__name__}: "
                                  f"{cause}") from (cause if isinstance(cause, BaseException)
                                                    else None)
        return result

    def open(self) -> None:
        """Join a process group with the server (the server's rank 1, this rank 0)."""
        from gaca_envs.net import rendezvous_port

        port = self.port or rendezvous_port()
        body = {"master_address": self.host, "master_port": port, "rank_offset": 1,
                "world_size": 2, "group_name": self.group_name, "backend": self.backend}
        self.group = self._both(
            lambda: self.engine._admin("init_weights_update_group", body),
            lambda: process_group(self.host, port, 0, 2, self.group_name, self.backend,
                                  self.timeout_s),
            f"opening the weight group with {self.engine.base_url}")

    def send(self, named: list[tuple[str, Any]], label: str) -> dict[str, float]:
        """The full weights ``named`` (learner tensors, cast to the wire dtype already) to
        the server, labelled ``label``: bytes and seconds."""
        if self.group is None:
            self.open()
        t0, sent = time.perf_counter(), 0
        parts = buckets(named, self.bucket_bytes)
        for i, bucket in enumerate(parts):
            tensors = [t.detach().contiguous() for _, t in bucket]
            if self.backend == "nccl":
                tensors = [t.cuda() for t in tensors]
            body = {"names": [n for n, _ in bucket],
                    "dtypes": [str(t.dtype).split(".")[-1] for t in tensors],
                    "shapes": [list(t.shape) for t in tensors],
                    "group_name": self.group_name, "flush_cache": i == len(parts) - 1,
                    "weight_version": label if i == len(parts) - 1 else None}

            def send_all(tensors=tensors):
                for tensor in tensors:  # one broadcast per tensor, in the listed order
                    broadcast(tensor, self.group, self.timeout_s)

            self._both(lambda: self.engine._admin("update_weights_from_distributed", body),
                       send_all, f"broadcasting weights bucket {i + 1}/{len(parts)} to "
                                 f"{self.engine.base_url}")
            sent += sum(t.numel() * t.element_size() for t in tensors)
        return {"perf/sync_bytes": float(sent), "perf/broadcast_s": time.perf_counter() - t0}

    def close(self) -> None:
        if self.group is not None:
            try:
                self.engine._admin("destroy_weights_update_group",
                                   {"group_name": self.group_name})
            except Exception:  # noqa: BLE001 - the server may be gone
                pass
            destroy(self.group)
            self.group = None


class VLLMBroadcaster(Broadcaster):
    """vLLM's weight-transfer engine (``/init_weight_transfer_engine``,
    ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``): NCCL only,
    through vLLM's own trainer end (its stateless group and packed broadcast), so ``vllm``
    must be importable where the learner runs."""

    def _vllm(self):
        try:
            from vllm.distributed.weight_transfer import nccl_common, packed_tensor
        except ImportError as err:
            raise WeightSyncError("server.kind: vllm with server.weight_transfer: broadcast "
                                  "needs vllm installed where the learner runs (vLLM's NCCL "
                                  "trainer end); use server.weight_transfer: disk otherwise"
                                  ) from err
        return nccl_common, packed_tensor

    def open(self) -> None:
        from types import SimpleNamespace

        from gaca_envs.net import rendezvous_port

        nccl_common, packed = self._vllm()
        port = self.port or rendezvous_port()
        rendezvous = SimpleNamespace(master_address=self.host, master_port=port, world_size=2)
        payload = nccl_common.build_worker_init_payload(
            rendezvous, packed=True, packed_buffer_size_bytes=self.bucket_bytes,
            packed_num_buffers=packed.DEFAULT_PACKED_NUM_BUFFERS)
        self.group = self._both(
            lambda: self.engine._admin("init_weight_transfer_engine", {"init_info": payload}),
            lambda: nccl_common.trainer_init(vars(rendezvous)),
            f"opening vLLM's weight transfer with {self.engine.base_url}")

    def send(self, named: list[tuple[str, Any]], label: str) -> dict[str, float]:
        if self.group is None:
            self.open()
        _, packed = self._vllm()
        t0 = time.perf_counter()
        info = {"names": [n for n, _ in named],
                "dtype_names": [str(t.dtype).split(".")[-1] for _, t in named],
                "shapes": [list(t.shape) for _, t in named]}
        self.engine._admin("start_weight_update")
        self._both(lambda: self.engine._admin("update_weights", {"update_info": info}),
                   lambda: packed.packed_nccl_broadcast_producer(
                       iter((n, t.cuda()) for n, t in named), self.group, 0,
                       lambda item: item[1], self.bucket_bytes,
                       packed.DEFAULT_PACKED_NUM_BUFFERS),
                   f"broadcasting weights to {self.engine.base_url}")
        self.engine._admin("finish_weight_update", {"weight_version": label})
        sent = sum(t.numel() * t.element_size() for _, t in named)
        return {"perf/sync_bytes": float(sent), "perf/broadcast_s": time.perf_counter() - t0}

    def close(self) -> None:
        if self.group is not None:
            try:
                self.engine._admin("shutdown_weight_transfer_engine")
            except Exception:  # noqa: BLE001 - the server may be gone
                pass
            self.group = None


def update_by_broadcast(engine, sender: Broadcaster, named: list[tuple[str, Any]], label: str,
                        version: int) -> dict[str, float]:
    """Generation paused (SGLang: held in place; vLLM: kept), the weights broadcast, then
    generation continued; the engine then checks answers against ``label``."""
    sglang = engine.kind == "sglang"
    if sglang:
        engine._admin("pause_generation", {"mode": "in_place"})
    else:
        engine._admin("pause?mode=keep")
    try:
        metrics = sender.send(named, label)
    except BaseException:
        sender.group = None  # a failed collective leaves the group unusable
        raise
    finally:
        try:
            engine._admin("continue_generation" if sglang else "resume")
        except Exception:  # noqa: BLE001 - the send's own error says more
            pass
    engine.synced(version, label, labelled=True)
    return metrics
