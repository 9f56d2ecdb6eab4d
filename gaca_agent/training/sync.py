"""Putting the learner's weights on the inference server after every update, and probing
the server before the next rollout (``model.engine: server``)."""

from __future__ import annotations

import secrets
import shutil
import time
from functools import partial
from pathlib import Path


class WeightSync:
    """After each update the learner's weights go to the inference server, which is then
    probed (gaca_agent/generate/probe.py) before the next rollout. LoRA: the adapter is
    saved under ``adapters/v{version}`` and loaded under a name unique to this run and
    version; full fine-tuning: the weights are saved under ``weights/v{version}`` and
    loaded through the server's disk-update API, labelled with that name. Every rank's
    engine then checks each response against it. A failed load or probe stops the run on
    every rank with the main process's reason."""

    def __init__(self, learner, engine, run_dir: Path, name: str, server,
                 temperature: float, eval_temperature: float, keep: int = 1,
                 fleet=None) -> None:
        from accelerate.utils import broadcast_object_list

        self.learner, self.engine, self.server = learner, engine, server
        self.fleet = fleet  # the servers Ray started (main process): lost ones replaced
        self.joining: dict[int, object] = {}  # replacements taking this version first
        self.lora = learner.config.lora_r > 0
        # the files kept: the adapters the server still serves (max_staleness + 1), and
        # the full weights of this version and the one before
        self.keep_files = max(2, keep) if self.lora else 2
        self.broadcast = not self.lora and server.weight_transfer == "broadcast"
        self.senders: dict[str, object] = {}  # the broadcast's learner ends, by server
        self.dir = run_dir / ("adapters" if self.lora else "weights")
        # the probe's metric prefix and temperature: the rollouts', then the held-out one
        # when it differs (greedy sampling, temperature 0, is not probed)
        self.temperatures = [("probe", temperature)] if temperature > 0 else []
        if eval_temperature > 0 and eval_temperature != temperature:
            self.temperatures.append(("probe_eval", eval_temperature))
        self.warned_seed = False
        token = [secrets.token_hex(3)]
        if learner.accelerator.num_processes > 1:
            broadcast_object_list(token)
        self.prefix = f"{name}-{token[0]}"

    def __call__(self, version: int) -> dict[str, float]:
        acc = self.learner.accelerator
        t0 = time.perf_counter()
        name, path = f"{self.prefix}-v{version}", self.dir / f"v{version}"
        self.joining = self._joining()
        if self.lora:
            self.learner.save_adapter(path)
            load = partial(self._load_adapter, path, name, version)
        elif self.broadcast:
            named = self.learner.full_weights(self.server.sync_dtype)
            load = partial(self._broadcast, named, name, version)
        else:
            self.learner.save_weights(path, self.server.sync_dtype)
            load = partial(self._from_disk, path, name, version)
        sent = self._on_main(load, f"weight sync of version {version} failed") or {}
        self._admit()
        if not acc.is_main_process:  # the other ranks' engines (the main one has it)
            for engine in self.engine.members:
                engine.synced(version, name, labelled=not self.lora or engine.kind == "sglang")
                if self.lora:
                    engine.adapter = name
        with self.learner.rollout_context():  # every rank (FSDP gathers); the main probes
            metrics = self._on_main(self._probe,
                                    f"after the weight sync of version {version}")
        if acc.is_main_process:  # older versions are unloaded: drop their files
            kept = {f"v{v}" for v in range(version - self.keep_files + 1, version + 1)}
            for old in self.dir.glob("v*"):
                if old.name not in kept:
                    shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return {"sync/version": float(version), "sync/seconds": time.perf_counter() - t0,
                **sent, **(metrics or {})}

    def _joining(self) -> dict[int, object]:
        """Every rank's clients of the servers started in lost ones' places that are up
        (the main process replaces, and asks the fleet); each takes this sync's weights
        before it is admitted."""
        from accelerate.utils import broadcast_object_list

        up: list = [{}]
        if self.fleet is not None:
            self.fleet.replace(list(getattr(self.engine, "down", {})))
            up[0], failed = self.fleet.ready()
            for i, why in failed.items():
                print(f"warning: the inference server started in place of lost server {i}"
                      f" did not start ({why}); it is tried again at the next sync",
                      flush=True)
        if self.learner.accelerator.num_processes > 1:
            broadcast_object_list(up)
        joining = {}
        for i, url in up[0].items():
            old = self.engine.engines[i]
            sender = self.senders.pop(old.base_url, None)  # its broadcast group's port
            if sender is not None:
                sender.close()
            joining[i] = old.twin(url)
        return joining

    def _admit(self) -> None:
        """The joining servers that took the weights (the main process's word, on every
        rank) serve from now on."""
        from accelerate.utils import broadcast_object_list

        took = [sorted(self.joining)]
        if self.learner.accelerator.num_processes > 1:
            broadcast_object_list(took)
        for i in took[0]:
            self.engine.admit(i, self.joining[i])
        self.joining = {}

    def _on_each(self, step) -> list:
        """``step(server, index)`` on every server still up and every one joining, their
        results; a server found gone is dropped (and left out) when others are left, a
        joining one is not admitted."""
        out = []
        past = len(getattr(self.engine, "engines", [self.engine]))  # no member's index
        joining = [(past + k, e) for k, e in enumerate(self.joining.values())]
        for i, engine in [*enumerate(self.engine.members), *joining]:
            try:
                out.append(step(engine, i))
            except Exception as err:
                if any(e is engine for _, e in joining):
                    print(f"warning: the new inference server {engine.base_url} did not "
                          f"take the weights ({type(err).__name__}: {err}); left out",
                          flush=True)
                    self.joining = {j: e for j, e in self.joining.items() if e is not engine}
                elif not self.engine.lose(engine, err):
                    raise
        return out

    def _load_adapter(self, path: Path, name: str, version: int) -> dict[str, float]:
        self._on_each(lambda e, _: e.load_adapter(name, str(path.resolve()), version))
        return {}

    def _from_disk(self, path: Path, name: str, version: int) -> dict[str, float]:
        self._on_each(lambda e, _: e.update_weights_from_disk(str(path.resolve()), name,
                                                              version))
        return {"perf/sync_bytes": float(sum(f.stat().st_size for f in path.glob(
            "*.safetensors")))}

    def _broadcast(self, named, name: str, version: int) -> dict[str, float]:
        """The full weights to each server still up, each over its own group."""
        from gaca_agent.generate.transfer import update_by_broadcast

        sent: dict[str, float] = {}
        for out in self._on_each(lambda e, i: update_by_broadcast(
                e, self.senders.get(e.base_url) or self._sender(e, i), named, name, version)):
            for key, value in out.items():
                sent[key] = sent.get(key, 0.0) + value
        return sent

    def _sender(self, engine, i: int):
        import torch

        from gaca_agent.generate.transfer import Broadcaster, VLLMBroadcaster

        kind = VLLMBroadcaster if engine.kind == "vllm" else Broadcaster
        s = self.server
        sender = self.senders[engine.base_url] = kind(
            engine, s.transfer_host, s.transfer_port + i if s.transfer_port else 0,
            "nccl" if torch.cuda.is_available() else "gloo", s.transfer_timeout_s,
            s.bucket_mb << 20, group_name=f"{self.prefix}-weights" + (f"-{i}" if i else ""))
        return sender

    def close(self) -> None:
        for sender in self.senders.values():
            sender.close()
        self.senders.clear()

    def _on_main(self, step, context: str):
        """``step()`` on the main process; its result, or its failure raised on every
        rank with the main process's reason (a probe mismatch as
        :class:`ProbeMismatch`, anything else as :class:`WeightSyncError`)."""
        from accelerate.utils import broadcast_object_list

        from gaca_agent.generate.probe import ProbeMismatch
        from gaca_agent.generate.server_engine import WeightSyncError

        acc = self.learner.accelerator
        outcome: list = [None, None]
        if acc.is_main_process:
            try:
                outcome[1] = step()
            except Exception as err:  # every rank stops with the main process's reason
                outcome[0] = (isinstance(err, ProbeMismatch), f"{type(err).__name__}: {err}")
        if acc.num_processes > 1:
            broadcast_object_list(outcome)
        if outcome[0] is not None:
            mismatch, reason = outcome[0]
            raise (ProbeMismatch if mismatch else WeightSyncError)(f"{context}: {reason}")
        return outcome[1]

    def _probe(self) -> dict[str, float]:
        """The probe at the rollout and the held-out temperature (main process, inside the
        rollout context): its metrics; :class:`ProbeMismatch` beyond the tolerance."""
        from gaca_agent.generate.probe import check, probe

        def probed(engine, _):
            # the rollout probe scores where the update does (learner.temperature)
            results = [(tag, probe(engine, self.learner.score, t, self.server.probe_tokens,
                                   self.learner.config.scoring_temperature
                                   if tag == "probe" else None))
                       for tag, t in self.temperatures]
            for _, result in results:
                check(result, self.server.probe_tolerance, engine.kind)
            return results

        out: dict[str, float] = {}
        for results in self._on_each(probed):  # each server; the metrics of the farthest
            for tag, result in results:
                if result.mean_gap >= out.get(f"{tag}/mean_gap", -1.0):
                    out.update(result.metrics(tag))
        if not out.get("probe/seed_honoured", 1.0) and not self.warned_seed:
            self.warned_seed = True
            print("warning: the inference server ignores the request seed (SGLang: start "
                  "it with --enable-deterministic-inference): rollouts are not "
                  "reproducible from the run's seed; training is unaffected", flush=True)
        return out
