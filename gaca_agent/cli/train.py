"""``gaca-train``: collect, estimate, update, log, evaluate, checkpoint.

    gaca-train --config default [key=value ...]
    gaca-train --config paper/alfworld_qwen2_5_1_5b_gigpo --dry-run
    gaca-train --resume runs/default
    accelerate launch --multi_gpu --num_processes 2 -m gaca_agent.cli.train --config ...
    gaca-train --config default cluster.backend=ray cluster.learners=2   # ranks placed by Ray

Writes ``runs/<name>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one object per
iteration), TensorBoard events, ``checkpoints/`` (atomic; ``latest`` names the newest),
``warmup/`` (the warmed-up model: the KL reference, a warm start), ``rollouts/`` (every
iteration's episodes, unless ``keep_rollouts: false``), ``final/`` (model), the held-out
evaluations as gaca-eval writes them (results.json, episodes.jsonl, report.html):
``zero_shot_eval/`` (``warmup.eval_before``), ``warmup_eval/`` (before the first update)
and ``final_eval/``, and learning-curve PNGs.

With several processes each rank plays its share of the task groups and of the held-out
episodes; only the scalar step columns are gathered (for the group statistics), each rank
trains on its own rows.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gaca_agent.analysis.setting import describe
from gaca_agent.cli import fail
from gaca_agent.config import load_config
from gaca_agent.config.checks import InputError, check_config
from gaca_agent.training.loop import RunExists, TrainingStopped, refuse_existing, train

PROG = "gaca-train"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--resume", type=Path, default=None, help="a run directory")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar: one plain line per iteration (also when the "
                             "output is not a terminal)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved configuration and what it means, check its "
                             "inputs (env, data, model, servers), then exit")
    parser.add_argument("overrides", nargs="*", help="key=value (e.g. algo.estimator=gigpo)")
    args = parser.parse_args(argv)
    try:
        if args.resume:
            if not (args.resume / "config.yaml").exists():
                return fail(PROG, f"{args.resume} has no config.yaml to resume from")
            cfg = load_config(args.resume / "config.yaml", args.overrides)
        else:
            cfg = load_config(args.config, args.overrides)
    except (ValueError, TypeError, KeyError) as err:
        return fail(PROG, err.args[0] if isinstance(err, KeyError) and err.args else err)
    if args.dry_run:
        print(describe(cfg))
    try:
        check_config(cfg)
    except InputError as err:
        return fail(PROG, err)
    if args.dry_run:
        which = "training and held-out" if cfg.warmup.own_env_kwargs(cfg.env.kwargs) is None \
            else "training, held-out and warm-up"
        print(f"\ninputs checked: the env builds with its {which} kwargs, the data and model "
              "are found, the servers answer")
        return 0
    if cfg.cluster.backend == "ray" and "RANK" not in os.environ:  # before anything starts
        from gaca_agent.cluster.ray_pool import check_placement

        if not args.resume:
            try:
                refuse_existing((Path(cfg.out_dir) / cfg.name).resolve())
            except RunExists as err:
                return fail(PROG, err)

        problem = check_placement(cfg.cluster, cfg.env.workers)
        if problem:
            return fail(PROG, f"cannot place {problem} (lower the requests or add nodes)")
        watch_ray_head((args.resume or Path(cfg.out_dir) / cfg.name).resolve())
    if cfg.cluster.learners and "RANK" not in os.environ:  # not yet one of the ranks
        return launch(cfg, args)
    try:
        run_dir = train(cfg, args.resume, progress=not args.no_progress)
    except RunExists as err:
        return fail(PROG, err)
    except TrainingStopped as err:
        if os.environ.get("GACA_TRACEBACK"):
            raise
        return fail(PROG, err, code=1)
    print(f"run directory: {run_dir}")
    return 0


def watch_ray_head(run_dir: Path):
    """Ray ends this process by itself when its head is lost (no exception, no line of
    ours): one line first, naming the checkpoint that ``--resume`` continues from."""
    from gaca_agent.cluster.head import watch_head
    from gaca_agent.runs.rundir import resume_hint

    return watch_head(lambda line: print(f"{PROG}: {line}; {resume_hint(run_dir)}",
                                         file=sys.stderr, flush=True))


def launch(cfg, args: argparse.Namespace) -> int:
    """``cluster.learners``: this command run by that many ranks Ray places (each as
    under ``torchrun``); this process watches them and stops them all when one is lost."""
    import yaml

    from gaca_agent.cluster.learners import RankLost, run_ranks
    from gaca_agent.config import to_dict

    run_dir = (args.resume or Path(cfg.out_dir) / cfg.name).resolve()
    ranks = ["-m", "gaca_agent.cli.train", "--no-progress"]
    try:
        if args.resume:
            run_ranks(cfg.cluster, [*ranks, "--resume", str(run_dir), *args.overrides])
        else:
            refuse_existing(run_dir)
            run_ranks(cfg.cluster, [*ranks, "--config", "{config}"],
                      config=yaml.safe_dump(to_dict(cfg), sort_keys=False))
    except RunExists as err:
        return fail(PROG, err)
    except RankLost as err:
        return fail(PROG, TrainingStopped(run_dir, "the run", err), code=1)
    print(f"run directory: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
