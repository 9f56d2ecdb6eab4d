"""Learner ranks placed by Ray (``cluster.learners: N``).

``gaca-train`` with ``cluster.learners: N`` places N bundles (``learner_cpus``,
``learner_gpus``, ``learner_resources`` each) in a placement group, one
:class:`LearnerRank` actor in each, and sorts them by node and device: rank 0 is the
first bundle of the first node, local ranks follow the GPU ids. Each actor starts the
same ``gaca-train`` on its node with the variables ``torchrun`` would set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` of rank 0's node, and
``CUDA_VISIBLE_DEVICES`` listing the node's ranks' GPUs in local-rank order), so the
accelerate/FSDP2 code runs as under ``accelerate launch``. The rank's process dies with
its actor; a rank lost (its actor, process or node) stops every rank, and the launcher
says so in one line with the checkpoint ``--resume`` continues from.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from gaca_agent.cluster.fit import fit_problem, node_resources
from gaca_agent.cluster.ray_pool import ADDRESS_VAR, connect

PASSED_ON = ("GACA_", "HF_", "OMP_", "TOKENIZERS_", "ACCELERATE_", "TRANSFORMERS_", "WANDB_",
             "TRACKIO_", "NCCL_", "TORCH_", "PYTORCH_")
"""The launcher's environment variables each rank gets (the rest is its node's)."""


@dataclass(frozen=True)
class Place:
    """Where one bundle's actor runs."""

    node_id: str
    ip: str
    gpus: tuple[str, ...] = ()
    """Ray's GPU ids, as strings: indices, or UUIDs and MIG ids (``MIG-...``)."""


def _device_order(gpu: str) -> tuple:
    """Numeric ids by value (2 before 10), then the others (UUIDs, MIG ids) as named."""
    return (not gpu.isdigit(), int(gpu) if gpu.isdigit() else 0, gpu)


def gpu_ids(raw) -> tuple[str, ...]:
    """Ray's GPU ids as strings in device order (``int()`` fails on UUIDs and MIG ids)."""
    return tuple(sorted((str(g) for g in raw), key=_device_order))


class RankLost(RuntimeError):
    """A learner rank's actor, process or node was lost, or its process failed."""


def rank_order(places: list[Place]) -> list[int]:
    """The actors (indices into ``places``) in rank order: by node (address, then id),
    then by GPU id, then by bundle."""
    return sorted(range(len(places)), key=lambda i: (
        places[i].ip, places[i].node_id, [_device_order(str(g)) for g in places[i].gpus], i))


def rank_envs(places: list[Place], master_port: int) -> list[dict[str, str]]:
    """Each actor's torchrun variables (indexed as ``places``)."""
    order = rank_order(places)
    envs: list[dict[str, str]] = [{} for _ in places]
    for rank, i in enumerate(order):
        node = [j for j in order if places[j].node_id == places[i].node_id]
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(places)),
               "LOCAL_RANK": str(node.index(i)), "LOCAL_WORLD_SIZE": str(len(node)),
               "MASTER_ADDR": places[order[0]].ip, "MASTER_PORT": str(master_port)}
        if any(places[j].gpus for j in node):  # device LOCAL_RANK is this rank's own
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for j in node for g in places[j].gpus)
        envs[i] = env
    return envs


class LearnerRank:
    """One learner rank's process, on this actor's node."""

    def where(self) -> Place:
        import ray

        context = ray.get_runtime_context()
        return Place(context.get_node_id(), ray.util.get_node_ip_address(),
                     gpu_ids(ray.get_gpu_ids()))

    def port(self) -> int:
        from gaca_envs.net import rendezvous_port

        return rendezvous_port()

    def run(self, args: list[str], env: dict[str, str], cwd: str,
            config: str | None = None) -> int:
        """Run ``python *args`` (``{config}`` in ``args``: a file holding ``config``)
        until it exits; its exit code."""
        import ray

        from gaca_agent.cluster import reaper

        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            if config is not None:
                f.write(config)
                f.flush()
            env = {**os.environ, **env,
                   ADDRESS_VAR: ray.get_runtime_context().gcs_address}
            proc = reaper.start([sys.executable, *(a.replace("{config}", f.name)
                                                   for a in args)], env=env, cwd=cwd)
            return proc.wait()


def bundle(cluster) -> dict[str, float]:
    spec = {"CPU": float(cluster.learner_cpus), **{k: float(v) for k, v in
                                                   cluster.learner_resources.items()}}
    if cluster.learner_gpus:
        spec["GPU"] = float(cluster.learner_gpus)
    return spec


def run_ranks(cluster, args: list[str], cwd: str | None = None, config: str | None = None,
              on_placed=lambda line: print(line, flush=True)) -> None:
    """Run ``python *args`` as ``cluster.learners`` ranks placed by Ray; returns when all
    exited 0, raises :class:`RankLost` (after stopping the others) when one did not."""
    import ray
    from ray.exceptions import RayError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    connect(cluster, log_to_driver=True)  # the ranks' output shows here
    spec = bundle(cluster)
    problem = fit_problem([spec] * cluster.learners, node_resources(),
                          f"{cluster.learners} learner ranks of {spec}")
    if problem:  # at once: the placement group would wait learner_start_timeout_s
        raise RankLost(f"cannot place {problem}")
    group = placement_group([spec] * cluster.learners, strategy=cluster.learner_strategy)
    actors: list[Any] = []
    try:
        if not group.wait(cluster.learner_start_timeout_s):
            raise RankLost(f"cannot place {cluster.learners} learner ranks of {spec} "
                           f"({cluster.learner_strategy}) within "
                           f"{cluster.learner_start_timeout_s:g} s: the cluster has "
                           f"{ray.available_resources()} free")
        make = ray.remote(LearnerRank)
        actors = [make.options(
            num_cpus=spec["CPU"], num_gpus=spec.get("GPU", 0), max_restarts=0,
            resources={k: v for k, v in spec.items() if k not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i)).remote()
            for i in range(cluster.learners)]
        places = ray.get([a.where.remote() for a in actors])
        order = rank_order(places)
        envs = rank_envs(places, ray.get(actors[order[0]].port.remote()))
        passed = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ON)}
        for rank, i in enumerate(order):
            on_placed(f"learner rank {rank}: node {places[i].ip} ({places[i].node_id}), "
                      f"GPUs {list(places[i].gpus)}")
        runs = {actors[i].run.remote(args, {**passed, **envs[i]}, cwd or os.getcwd(), config):
                rank for rank, i in enumerate(order)}
        while runs:
            done, _ = ray.wait(list(runs), num_returns=1)
            rank = runs.pop(done[0])
            where = places[order[rank]].ip
            try:
                code = ray.get(done[0])
            except RayError as err:
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise RankLost(f"learner rank {rank} on {where} was lost with its actor, "
                               f"process or node ({reason})") from None
            if code != 0:
                raise RankLost(f"learner rank {rank} on {where} exited with code {code} "
                               f"(its own error is above)")
    finally:
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)  # its rank's process dies with it
            except Exception:  # noqa: BLE001 - gone with its node
                pass
        remove_placement_group(group)
