"""``gaca-eval``: evaluate any policy on any ``gaca/`` env or named suite.

    gaca-eval --env gaca/ALFWorld-v0 --env-kwargs split=valid_seen --policy expert \\
              --episodes all --workers 2 --out runs/eval/expert
    gaca-eval --suite alfworld --policy hf:runs/x/final --out runs/suite/x
    gaca-eval --compare runs/suite/x runs/suite/y

``--episodes all`` covers every task of the split once, in task-id order; N episodes
with N >= the number of tasks play task ``i % num_tasks``; fewer take N evenly spaced task
ids (``floor(i * num_tasks / N)``), so a partial ALFWorld evaluation (games sorted by task
type) covers every type in proportion instead of only the first. Episode i has seed
``seed + i``, and a stochastic policy draws episode i's randomness from that seed alone,
so a resumed evaluation plays exactly what an uninterrupted one would. A model policy
(``hf:``, ``smollm2``, ``openai:``) samples at temperature 0.4, as training's held-out
evaluation does, unless ``--policy-kwargs temperature=T`` says otherwise.

Each episode is appended to ``episodes.jsonl`` the moment it ends, so re-running with the
same ``--out`` (or ``gaca-eval --resume OUT``) skips finished ones. Failed episodes (a
worker killed, an env that raised) are played again at once, up to twice; one that still
fails is recorded with its reason. The progress bar counts
episodes and env steps. Ctrl-C, or a policy or env that fails (a server gone), stops
cleanly: what finished is saved (with ``results.json`` and ``report.html`` over it) and
the same command resumes. Writes
``results.json``, ``episodes.jsonl`` and ``report.html``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gaca_agent.runs.results import drop_partial_line, episode_record, read_episodes, summarize


class EvaluationFailed(RuntimeError):
    """The policy or the envs failed mid-evaluation; what finished is saved in ``out``."""

    def __init__(self, out: Path, finished: int, planned: int, error: BaseException) -> None:
        reason = " ".join(str(error).split()) or type(error).__name__
        super().__init__(f"{reason}; {finished} of {planned} episodes saved in {out}: the "
                         "same command continues from there")
        self.out, self.finished, self.planned = out, finished, planned


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C during an evaluation; what finished is saved in ``out``."""

    def __init__(self, out: Path, finished: int, planned: int) -> None:
        super().__init__(f"interrupted: {finished} of {planned} episodes saved in {out}; "
                         "run the same command (or gaca-eval --resume OUT) to continue")
        self.out, self.finished, self.planned = out, finished, planned


_NUM_TASKS: dict[str, int | None] = {}


def num_tasks_of(env_id: str, env_kwargs: dict[str, Any],
                 servers: Sequence[str] | None = None) -> int | None:
    """How many tasks ``env_id`` has with ``env_kwargs`` (asked of the first env server
    when ``servers`` are given); ``None`` for an env without ``num_tasks`` (a plain
    gymnasium env: its episodes differ by seed alone). Remembered per process: the input
    check builds the env once and the command does not build it again."""
    key = json.dumps([env_id, env_kwargs, list(servers or ())], sort_keys=True, default=str)
    if key not in _NUM_TASKS:
        _NUM_TASKS[key] = _count_tasks(env_id, env_kwargs, servers)
    return _NUM_TASKS[key]


def _count_tasks(env_id: str, env_kwargs: dict[str, Any],
                 servers: Sequence[str] | None) -> int | None:
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    if servers:
        from gaca_envs.remote.client import RemoteEnv

        env = RemoteEnv(servers[0], env_kwargs, token=os.environ.get("GACA_ENV_TOKEN"))
    else:
        env = gym.make(env_id, **env_kwargs)
    try:
        n = getattr(env.unwrapped, "num_tasks", None)
        return None if n is None else int(n)
    finally:
        env.close()


#: Seed of a training run's held-out episode i is EVAL_SEED + i, in every evaluation of the
#: run (``gaca-eval --seed 10000`` with the same episodes and kwargs plays the same tasks).
EVAL_SEED = 10_000


def plan(episodes: str | int, num_tasks: int | None, seed: int) -> list[tuple[int, int]]:
    """(task_id, seed) of every episode index (see the module docstring). Without a number
    of tasks (``None``) episode i is task i: its seed alone makes it differ."""
    if num_tasks is None and str(episodes) == "all":
        raise ValueError("this env has no num_tasks, so 'all' means nothing: give a number "
                         "of episodes")
    try:
        n = num_tasks if str(episodes) == "all" else int(episodes)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"episodes must be a positive number or 'all', got {episodes!r}")
    if num_tasks is None:
        return [(i, seed + i) for i in range(n)]
    if n < num_tasks:
        return [(i * num_tasks // n, seed + i) for i in range(n)]
    return [(i % num_tasks, seed + i) for i in range(n)]


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: what it plays (the env and its kwargs, ``episodes`` planned from
    ``seed``, each ``group_size`` times from the same seed), with which policy, and how its
    envs run (worker processes, live episodes, or ``env_servers``: ``gaca-env-serve`` URLs
    to play on instead) with the prompt's ``history_length``."""

    env_id: str
    policy_spec: str
    episodes: str | int = 10
    env_kwargs: dict = field(default_factory=dict)
    policy_kwargs: dict | None = None
    seed: int = 0
    group_size: int = 1
    workers: int = 1
    max_live_envs: int = 16
    history_length: int = 2
    env_servers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")

    def meta(self) -> dict[str, Any]:
        """What ``config.json`` records: a resumed evaluation must play the same."""
        meta = {"env": self.env_id, "env_kwargs": self.env_kwargs, "policy": self.policy_spec,
                "episodes": str(self.episodes), "seed": self.seed}
        if self.policy_kwargs:  # a resumed evaluation must sample as the first part did
            meta["policy_kwargs"] = self.policy_kwargs
        if self.group_size > 1:
            meta["group_size"] = self.group_size
        return meta


def evaluate(ev: Evaluation, out: Path, progress: bool = True, policy=None,
             retries: int = 2) -> dict[str, Any]:
    """Run (or resume) evaluation ``ev`` into ``out`` (``policy``: an instance of
    ``ev.policy_spec`` already made); returns the results dict. Raises
    :class:`EvaluationInterrupted` on Ctrl-C after saving what finished, and
    :class:`EvaluationFailed` when the policy or the envs fail, after saving what finished.
    Nothing is written before the plan is made (a bad ``episodes`` leaves no folder).
    Episodes that failed (their worker died, their env raised) are played again, up to
    ``retries`` more rounds; one that still fails stays in the results with its reason."""
    planned = plan(ev.episodes, num_tasks_of(ev.env_id, ev.env_kwargs, ev.env_servers),
                   ev.seed)
    out.mkdir(parents=True, exist_ok=True)
    meta = ev.meta()
    config_path = out / "config.json"
    if config_path.exists():
        previous = json.loads(config_path.read_text())
        if previous != meta:
            raise ValueError(f"{out} holds another evaluation ({previous}); use a new --out")
    config_path.write_text(json.dumps(meta, indent=2))
    episodes_path = out / "episodes.jsonl"
    drop_partial_line(episodes_path)
    records = read_episodes(episodes_path)
    g, total = ev.group_size, len(planned) * ev.group_size
    try:
        for attempt in range(1 + retries):  # failed episodes (a worker died) are replayed
            todo = [(i, task) for i, task in enumerate(planned)
                    if any(k not in records or records[k]["failed"]
                           for k in range(i * g, i * g + g))]
            if not todo:
                break
            if attempt and progress:
                print(f"replaying {len(todo)} failed episode group(s) (try {attempt + 1} of "
                      f"{1 + retries})", flush=True)
            _play(ev, todo, records, episodes_path, progress, policy)
    except KeyboardInterrupt:
        write_results(out, records, meta, ev.policy_spec, ev.env_id, complete=False)
        raise EvaluationInterrupted(out, sum(not r["failed"] for r in records.values()),
                                    total) from None
    except Exception as err:
        write_results(out, records, meta, ev.policy_spec, ev.env_id, complete=False)
        if os.environ.get("GACA_TRACEBACK"):
            raise
        raise EvaluationFailed(out, sum(not r["failed"] for r in records.values()),
                               total, err) from err
    return write_results(out, records, meta, ev.policy_spec, ev.env_id, complete=True)


def _play(ev: Evaluation, todo, records, episodes_path: Path, progress: bool,
          policy=None) -> None:
    """Play the episodes of ``todo`` (``ev.group_size`` each, from the same seed), appending
    each one to the file as it ends; episode index = planned index x group_size + member."""
    from tqdm import tqdm

    from gaca_agent.collect.collector import Collector
    from gaca_agent.collect.settings import EnvSection
    from gaca_agent.policies import make_policy
    from gaca_agent.runs.progress import quiet_libraries

    quiet_libraries()
    group_size = ev.group_size
    kwargs = eval_policy_kwargs(ev.policy_spec, ev.policy_kwargs)
    policy = policy or make_policy(ev.policy_spec, **kwargs)
    # gaca-eval reports the environment's own rewards: no invalid-action penalty
    collector = Collector(EnvSection(id=ev.env_id, kwargs=dict(ev.env_kwargs),
                                     workers=ev.workers,
                                     max_live_envs=max(1, min(ev.max_live_envs,
                                                              len(todo) * group_size)),
                                     history_length=ev.history_length, invalid_penalty=0.0,
                                     servers=tuple(ev.env_servers)))
    at = f" at temperature {kwargs['temperature']:g}" if "temperature" in kwargs else ""
    bar = tqdm(total=len(todo) * group_size, desc=f"{ev.policy_spec} on {ev.env_id}{at}",
               unit="ep", disable=not progress)
    index_of = {g: i for g, (i, _) in enumerate(todo)}
    steps = 0

    def count(n: int) -> None:
        nonlocal steps
        steps += n
        bar.set_postfix(steps=steps, refresh=True)

    with open(episodes_path, "a") as f:
        def write(ep, rows):
            index = index_of[ep.group] * group_size + ep.traj % group_size
            record = episode_record(index, ep, rows)
            record["group"], record["traj"] = index_of[ep.group], index
            records[index] = record
            f.write(json.dumps(record) + "\n")
            f.flush()
            bar.update(1)

        try:
            collector.run(policy, [task for _, task in todo], group_size, on_episode=write,
                          on_step=count)
        finally:
            collector.close()
            bar.close()


def eval_policy_kwargs(policy_spec: str, policy_kwargs: dict | None) -> dict:
    """The policy kwargs of an evaluation: a model policy samples at
    :data:`~gaca_agent.policies.EVAL_TEMPERATURE` unless ``temperature`` is given."""
    from gaca_agent.policies import EVAL_TEMPERATURE, samples

    defaults = {"temperature": EVAL_TEMPERATURE} if samples(policy_spec) else {}
    return {**defaults, **(policy_kwargs or {})}


def write_evaluation(out: Path, records: dict[int, dict], meta: dict, policy_spec: str,
                     env_id: str) -> dict[str, Any]:
    """A complete evaluation played elsewhere (gaca-train's final one) written as gaca-eval
    writes its own: ``config.json``, ``episodes.jsonl`` (by index), ``results.json`` and
    ``report.html``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(meta, indent=2))
    with open(out / "episodes.jsonl", "w") as f:
        for index in sorted(records):
            f.write(json.dumps(records[index]) + "\n")
    return write_results(out, records, meta, policy_spec, env_id, complete=True)


def write_results(out: Path, records, meta, policy_spec: str, env_id: str,
                  complete: bool) -> dict[str, Any]:
    """``results.json`` and ``report.html`` over the episode ``records`` (index -> record)."""
    from gaca_agent.runs.report import render_report

    results = summarize(records.values(), {**meta, "complete": complete, "finished_at":
                                           time.strftime("%Y-%m-%dT%H:%M:%S")})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.html").write_text(render_report(results, records.values(),
                                                   f"{policy_spec} on {env_id}"))
    return results
