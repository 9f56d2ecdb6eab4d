"""gaca-train end to end: run directory, resume after a kill, 2-process DDP, the default."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "gaca_agent" / "configs" / "default.yaml"
SMALL = ["iterations=4", "eval_every=0", "checkpoint_every=1", "env.groups=2",
         "env.group_size=2", "env.max_live_envs=4", "warmup.bc_steps=40",
         "warmup.bc_episodes=4", "model.max_new_tokens=12", "learner.kl_coef=0.01",
         "learner.micro_batch_size=8", "env.invalid_penalty=-0.1"]


def env_vars():
    return {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_train(args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", *args],
                          cwd=cwd, env=env_vars(), capture_output=True, text=True,
                          timeout=timeout)


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["iteration"]: {k: v for k, v in r.items() if not k.startswith("perf/")}
            for r in rows}


def test_config_errors_list_valid_keys(tmp_path):
    from gaca_agent.config import load_config

    with pytest.raises(ValueError, match="unknown key.*'lerner'.*valid: .*'learner'"):
        load_config(None, ["lerner.lr=1"])
    with pytest.raises(ValueError, match="valid: .*'clip_high'"):
        load_config(None, ["learner.clip=0.3"])
    with pytest.raises(KeyError, match="unknown estimator"):
        load_config(None, ["algo.estimator=gipo"])
    cfg = load_config(DEFAULT, ["algo.estimator=gigpo",
                                                          "algo.params={omega: 0.5}"])
    assert cfg.algo.estimator == "gigpo" and cfg.algo.params == {"omega": 0.5}
    bad = run_train(["--config", str(DEFAULT), "env.grups=2"],
                    tmp_path)
    assert bad.returncode != 0 and "valid:" in bad.stderr


@pytest.mark.parametrize("override, message", [
    ("iterations=abc", "iterations must be an integer, got 'abc'"),
    ("iterations=2.5", "iterations must be an integer, got 2.5"),
    ("learner.lr=fast", "learner.lr must be a number, got 'fast'"),
    ("seed=[1, 2]", "seed must be an integer, got [1, 2]"),
    ("warmup.bc_steps=-3", "warmup.bc_steps >= 0"),
    ("name=../../escape", "name must be a plain folder name"),
    ("env.nll_span=tokens", "env.nll_span must be one of"),
    ("learner.bf16=maybe", "learner.bf16 must be true, false or 'auto', got 'maybe'"),
    ("keep_rollouts=episodes", "keep_rollouts must be true, false or 'tokens', got 'episodes'"),
    ("env.eval_episodes=0", "env.eval_episodes must be 'all' or >= 1"),
    ("iterations=0", "iterations must be >= 1"),
    ("model.temperature=-1", "model.temperature and model.eval_temperature must be >= 0"),
    ("model.eval_temperature=-0.5", "model.temperature and model.eval_temperature must be"),
    ("env.reward_scale=0", "env.reward_scale must be > 0, got 0"),
    ("env.reward_scale=-2", "env.reward_scale must be > 0, got -2"),
])
def test_config_values_are_checked_at_load_time_naming_the_key(override, message):
    from gaca_agent.config import load_config

    with pytest.raises(ValueError) as err:
        load_config(DEFAULT, [override])
    assert message in str(err.value)


def test_config_type_errors_reach_the_user_without_a_traceback(tmp_path):
    run = run_train(["--config", str(DEFAULT), "iterations=abc",
                     f"out_dir={tmp_path}"], tmp_path)
    assert run.returncode == 2 and "iterations must be an integer" in run.stderr
    assert "Traceback" not in run.stderr and not list(tmp_path.iterdir())


DISK_FULL = """
import errno, sys
from pathlib import Path
from gaca_agent.learner.core import Learner
save, calls = Learner.save, []
def failing(self, path):
    calls.append(path)
    if len(calls) == 2:  # the second checkpoint: half written, then the disk is full
        (Path(path) / "model").mkdir(parents=True, exist_ok=True)
        (Path(path) / "model" / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    return save(self, path)
Learner.save = failing
from gaca_agent.cli.train import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_and_resume_reproduces_the_next_iteration(tmp_path):
    base = ["--config", str(DEFAULT), f"out_dir={tmp_path}", *SMALL]
    full = run_train([*base, "name=full"], tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    # --no-progress: one plain line per iteration, and no library bars break in
    lines = [x for x in full.stdout.splitlines() if x.startswith("full iteration ")]
    assert [x.split(":")[0] for x in lines] == [f"full iteration {i}/4" for i in range(1, 5)]
    assert all("rollout success" in x and "policy loss" in x for x in lines)
    assert "Writing model shards" not in full.stderr and "Loading weights" not in full.stderr
    full_dir = tmp_path / "full"
    for name in ("config.yaml", "metrics.jsonl", "final/model/config.json",
                 "final_eval/results.json", "final_eval/report.html", "curves.png"):
        assert (full_dir / name).exists(), name
    assert list((full_dir / "tensorboard").glob("events.*"))
    # the same run, killed once its iteration-1 checkpoint is in place
    proc = subprocess.Popen([sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", *base,
                             "name=killed"], cwd=tmp_path, env=env_vars(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() == "iter-00001":
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    latest_before = latest.read_text().strip()
    assert latest_before in ("iter-00001", "iter-00002")
    resumed = run_train(["--resume", str(tmp_path / "killed")], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = metrics(full_dir), metrics(tmp_path / "killed")
    assert sorted(a) == sorted(b) == [-1, 0, 1, 2, 3]
    resumed_from = int(latest_before[-1]) + 1  # the first iteration the resumed run played
    for it in range(resumed_from, 4):  # every later iteration, every metric (KL included)
        assert set(a[it]) == set(b[it]), it
        assert a[it]["losses/kl"] > 0, it
        for key, value in a[it].items():
            assert b[it][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (it, key)
    # the disk fills while the second checkpoint is written: one line names the cause and
    # the intact checkpoint, nothing half-written is left, and --resume finishes the run
    full_disk = subprocess.run([sys.executable, "-c", DISK_FULL, "--no-progress", *base,
                                "name=diskfull"], cwd=tmp_path, env=env_vars(),
                               capture_output=True, text=True, timeout=600)
    assert full_disk.returncode == 1, full_disk.stderr[-3000:]
    error = [x for x in full_disk.stderr.splitlines() if x.startswith("gaca-train: error:")]
    assert error and "Traceback" not in full_disk.stderr, full_disk.stderr[-3000:]
    assert "iteration 2/4 stopped" in error[0] and "could not write checkpoint iter-00001" \
        in error[0] and "No space left on device" in error[0], error
    assert "latest checkpoint, iter-00000, is intact" in error[0], error
    ckpts = tmp_path / "diskfull" / "checkpoints"
    assert sorted(x.name for x in ckpts.iterdir()) == ["iter-00000", "latest"]
    resumed = run_train(["--resume", str(tmp_path / "diskfull")], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    c = metrics(tmp_path / "diskfull")
    assert sorted(c) == [-1, 0, 1, 2, 3]
    for it in range(1, 4):
        for key, value in a[it].items():
            assert c[it][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (it, key)


@pytest.mark.skipif(shutil.which("accelerate") is None, reason="accelerate CLI not installed")
def test_two_process_ddp_keeps_ranks_identical(tmp_path):
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "gaca_agent.cli.train", "--no-progress", "--config",
           str(DEFAULT), f"out_dir={tmp_path}", "name=ddp",
           *SMALL, "iterations=2", "env.groups=3", "eval_every=1", "env.eval_episodes=5"]
    run = subprocess.run(cmd, cwd=tmp_path, env={**env_vars(), "ACCELERATE_USE_CPU": "1"},
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    digests = json.loads((tmp_path / "ddp" / "final" / "rank_digests.json").read_text())
    assert len(digests["digests"]) == 2 and digests["in_sync"]
    rows = metrics(tmp_path / "ddp")
    assert sorted(rows) == [-1, 0, 1]
    # 3 groups x 2 rollouts over 2 ranks (2 + 1 groups): every episode counted once
    steps = [json.loads(x) for f in sorted((tmp_path / "ddp" / "rollouts").glob("iter-00001.*"))
             for x in gzip.open(f, "rt")]
    assert sorted((r["group"], r["traj"]) for r in steps) == [(g, 2 * g + i) for g in range(3)
                                                             for i in range(2)]
    lengths = sum(r["steps"] for r in steps) / len(steps)
    assert rows[1]["rollout/length"] == pytest.approx(lengths)
    assert rows[1]["train/tokens"] > 0 and "eval/success" in rows[1]
    final = json.loads((tmp_path / "ddp" / "final_eval" / "results.json").read_text())
    assert final["n"] == 5  # held-out episodes split over the ranks, gathered once each


@pytest.mark.parametrize("launcher, fsdp", [("accelerate", False), ("torchrun", True)])
def test_unequal_shares_across_ranks_finish_in_sync(tmp_path, tiny_model_path, launcher, fsdp):
    """Rank 0 holds 7 step rows, rank 1 one; they also generate different numbers of
    tokens. With DDP (accelerate) and FSDP2 (torchrun), the updates finish within the
    timeout, metrics agree and the parameters end identical."""
    out = tmp_path / "probe"
    probe = [str(ROOT / "tests" / "dist_probe.py"), tiny_model_path, str(out),
             json.dumps({"fsdp": fsdp, "bf16": fsdp})]
    if launcher == "accelerate":
        if shutil.which("accelerate") is None:
            pytest.skip("accelerate CLI not installed")
        cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               *probe]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *probe]
    run = subprocess.run(cmd, cwd=tmp_path, env={**env_vars(), "ACCELERATE_USE_CPU": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"probe.rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert ranks[0]["sharded"] is fsdp and ranks[1]["sharded"] is fsdp
    assert ranks[0]["generated"] != ranks[1]["generated"]
    assert ranks[0]["metrics"][0]["train/tokens"] == 20 + 2  # both ranks' rows, once each


@pytest.mark.slow  # about 2.5 minutes on 2 cores: CI runs it
def test_default_config_beats_its_warm_up_on_held_out_tasks(tmp_path):
    """The embedded default, as shipped (iteration-bounded, not timed)."""
    run = run_train(["--config", str(DEFAULT), f"out_dir={tmp_path}",
                     "checkpoint_every=0"], tmp_path, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = metrics(tmp_path / "default")
    warm = rows[-1]["eval/success"]
    final = rows[max(rows)]["eval/success"]
    assert final >= warm + 0.3, (warm, final)
    assert rows[max(rows)]["rollout/format_invalid"] < 0.2
    # each iteration's logged rollout success is its stored rollouts' share of wins
    for it in range(max(rows) + 1):
        episodes = [json.loads(x) for f in (tmp_path / "default" / "rollouts").glob(
            f"iter-{it:05d}.*") for x in gzip.open(f, "rt")]
        assert episodes, it
        won = sum(bool(e["won"]) for e in episodes) / len(episodes)
        assert rows[it]["rollout/success"] == pytest.approx(won), it
    assert rows[max(rows)]["rollout/success"] > rows[0]["rollout/success"]


def test_a_run_starts_from_another_runs_warm_up(tmp_path, fresh_accelerate):
    """warmup/ holds the warmed-up model as a transformers folder: a run with it as
    model.path and no warm-up of its own evaluates, before any update, as the run that
    made it did right after its warm-up (one warm start for many RL runs)."""
    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train

    small = [*SMALL, "iterations=1", "eval_every=1", "checkpoint_every=0", "env.eval_episodes=8",
             f"out_dir={tmp_path}"]
    first = train(load_config(str(DEFAULT), [*small, "name=first"]), progress=False)
    assert (first / "warmup" / "config.json").exists()
    assert (first / "warmup" / "tokenizer_config.json").exists()
    second = train(load_config(str(DEFAULT), [*small, "name=second", "warmup.bc_steps=0",
                                              f"model.path={first / 'warmup'}"]),
                   progress=False)
    warmed, started = metrics(first)[-1], metrics(second)[-1]
    assert "warmup/last_loss" in warmed and "warmup/last_loss" not in started
    evals = sorted(k for k in warmed if k.startswith("eval/"))
    assert evals and {k: started[k] for k in evals} == {k: warmed[k] for k in evals}
    assert warmed["eval/format_invalid"] < 1.0  # the warm-up taught something to keep


def test_the_final_evaluation_reuses_the_last_iterations_evaluation(tmp_path, fresh_accelerate,
                                                                    monkeypatch):
    """The last iteration's held-out evaluation plays the final weights on the final
    evaluation's episodes: final_eval/ is written from it, not played a second time."""
    from gaca_agent.config import load_config
    from gaca_agent.training import held_out
    from gaca_agent.training.loop import train

    played = []
    init = held_out.HeldOut.__init__
    monkeypatch.setattr(held_out.HeldOut, "__init__",
                        lambda self, *a: (played.append(1), init(self, *a))[1])
    run = train(load_config(str(DEFAULT), [
        *SMALL, "iterations=2", "eval_every=1", "checkpoint_every=0", "env.eval_episodes=8",
        "warmup.bc_steps=5", f"out_dir={tmp_path}", "name=reuse"]), progress=False)
    assert len(played) == 3  # after the warm-up, after each iteration; none more
    last = metrics(run)[1]
    final = json.loads((run / "final_eval" / "results.json").read_text())
    assert final["n"] == 8 and final["success_rate"] == pytest.approx(last["eval/success"])
    assert final["mean_steps"] == pytest.approx(last["eval/length"])
    # the evaluation before the first update is kept too, as gaca-eval writes one: the
    # warm-up's gain is then compared pair by pair on the same episodes
    from gaca_agent.analysis.paired import paired_line

    start = json.loads((run / "warmup_eval" / "results.json").read_text())
    assert start["n"] == 8 and start["success_rate"] == pytest.approx(
        metrics(run)[-1]["eval/success"])
    line = paired_line(run / "warmup_eval", run / "final_eval")
    assert line is not None and "paired over the 8 episodes" in line
    assert not (run / "zero_shot_eval").exists()  # warmup.eval_before is off
