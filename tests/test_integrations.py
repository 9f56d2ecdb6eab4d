"""gaca inside other packages, each driven through the real package: verl's estimator
registry, TRL's GRPOTrainer, verifiers' rollouts, W&B and Trackio logging, datasets."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import gaca_envs
from gaca_agent.advantages import StepBatch, compute, names

from conftest import has_module

gym.register_envs(gaca_envs)


def diag_episodes(groups: int = 3, per_group: int = 4, seed: int = 0):
    """Random play of gaca/Diag-Signs-v0: per episode, a list of (state_key, reward)."""
    rng = random.Random(seed)
    env = gym.make("gaca/Diag-Signs-v0", max_episode_steps=12)
    episodes = []
    for g in range(groups):
        for k in range(per_group):
            obs, info = env.reset(seed=100 * g + k, options={"task_id": g})
            steps, done = [], False
            while not done:
                key = info["state_key"]
                obs, r, term, trunc, info = env.step(rng.choice(info["admissible_actions"]))
                steps.append((key, float(r)))
                done = term or trunc
            episodes.append((g, steps))
    env.close()
    return episodes


# ------------------------------------------------------------------------------ verl
needs_verl = pytest.mark.skipif(not (has_module("verl") and has_module("torch")),
                                reason="needs verl (pip install gaca[integrations])")


def verl_agent_layout(episodes, seed: int = 0):
    """The episodes as verl-agent batches them: rows step-major (step 0 of every env,
    then step 1, ...), a response of random length per row, the episode's return on the
    last response token, per-step rewards, anchors, uid/traj_uid and old log-probs."""
    import torch

    rng = np.random.default_rng(seed)
    order = [(e, t) for t in range(max(len(s) for _, s in episodes))
             for e, (_, s) in enumerate(episodes) if t < len(s)]
    n, width = len(order), 7
    lengths = rng.integers(1, width + 1, size=n)
    mask = torch.zeros(n, width)
    token_rewards = torch.zeros(n, width)
    log_probs = torch.tensor(-rng.gamma(1.0, 1.0, size=(n, width)), dtype=torch.float32)
    responses = torch.tensor(rng.integers(0, 3, size=(n, width)))
    for i, (e, _t) in enumerate(order):
        mask[i, : lengths[i]] = 1
        token_rewards[i, lengths[i] - 1] = sum(r for _, r in episodes[e][1])
    fields = {
        "uid": np.array([f"task-{episodes[e][0]}" for e, _ in order], dtype=object),
        "traj_uid": np.array([f"traj-{e}" for e, _ in order], dtype=object),
        "anchor_obs": np.array([episodes[e][1][t][0] for e, t in order], dtype=object),
        "rewards": np.array([episodes[e][1][t][1] for e, t in order], dtype=np.float32),
    }
    return order, token_rewards, mask, {"old_log_probs": log_probs, "responses": responses}, fields


def own_rows(episodes, order, mask, tensors):
    """Our own StepBatch of the same steps, episode-major (rows in another order)."""
    index = {pair: i for i, pair in enumerate(order)}
    log_probs, responses = tensors["old_log_probs"], tensors["responses"]
    action = [tuple(responses[i][mask[i] > 0].tolist()) for i in range(len(order))]
    nll_row = (-(log_probs * mask).sum(-1) / mask.sum(-1)).double().numpy()
    rows = [(e, t) for e, (_, s) in enumerate(episodes) for t in range(len(s))]
    keys = lambda e, t: episodes[e][1][t][0] if t < len(episodes[e][1]) else "<end>"  # noqa: E731
    batch = StepBatch(
        group=[episodes[e][0] for e, _ in rows], traj=[e for e, _ in rows],
        t=[t for _, t in rows], reward=[episodes[e][1][t][1] for e, t in rows],
        state=[keys(e, t) for e, t in rows], next_state=[keys(e, t + 1) for e, t in rows],
        nll=[nll_row[index[(e, t)]] for e, t in rows],
        entropy=[nll_row[index[(e, t)]] for e, t in rows],
        action=[hash(action[index[(e, t)]]) for e, t in rows],
        terminal=[t == len(episodes[e][1]) - 1 for e, t in rows])
    return rows, batch


@needs_verl
def test_verl_finds_every_estimator_and_each_equals_ours_row_for_row():
    import torch
    from verl.trainer.ppo import core_algos

    importlib.import_module("gaca_agent.integrations.verl")  # registers on import

    episodes = diag_episodes()
    order, token_rewards, mask, tensors, fields = verl_agent_layout(episodes)
    rows, ours = own_rows(episodes, order, mask, tensors)
    assert core_algos.get_adv_estimator_fn("gaca") is core_algos.get_adv_estimator_fn(
        "gaca_gaca")
    for name in names():
        fn = core_algos.get_adv_estimator_fn(f"gaca_{name}")
        adv, returns = fn(token_level_rewards=token_rewards, response_mask=mask,
                          index=fields["uid"], config=None, batch=tensors,
                          non_tensor_batch=fields)
        assert adv.shape == mask.shape and torch.equal(adv, returns)
        assert torch.all(adv[mask == 0] == 0)  # nothing outside the response
        want, _ = compute(name, ours)
        got = {pair: adv[i, 0].item() for i, pair in enumerate(order)}
        np.testing.assert_allclose([got[pair] for pair in rows], want, rtol=1e-5,
                                   atol=1e-6, err_msg=name)
        assert np.any(np.abs(want) > 1e-3), name  # a batch that tells estimators apart


@needs_verl
def test_verls_own_compute_advantage_runs_ours_on_single_turn_rows():
    """Stock verl passes only rewards, mask and uid: each row is a one-step episode."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    importlib.import_module("gaca_agent.integrations.verl")  # registers on import

    rng = np.random.default_rng(1)
    n, width = 12, 5
    mask = torch.tensor(rng.integers(0, 2, size=(n, width)), dtype=torch.float32)
    mask[:, 0] = 1
    scores = rng.integers(0, 2, size=n).astype(np.float32)
    token_rewards = torch.zeros(n, width)
    token_rewards[:, 0] = torch.tensor(scores)
    uid = np.array([f"prompt-{i // 4}" for i in range(n)], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards,
                                        "response_mask": mask},
                               non_tensors={"uid": uid})
    data = compute_advantage(data, adv_estimator="gaca_grpo")
    want, _ = compute("grpo", StepBatch(group=uid, traj=np.arange(n), t=np.zeros(n, int),
                                        reward=scores, state=uid))
    np.testing.assert_allclose(data.batch["advantages"][:, 0].numpy(), want, rtol=1e-5)
    assert np.any(want != 0)
    with pytest.raises(ValueError, match="gaca_gaca needs the batch's old_log_probs"):
        compute_advantage(data, adv_estimator="gaca")  # stock verl passes no log-probs


# ------------------------------------------------------------------------------- TRL
needs_trl = pytest.mark.skipif(not (has_module("trl") and has_module("torch")),
                               reason="needs trl (pip install gaca[integrations])")


def test_trl_environment_plays_as_the_gym_env_and_keeps_ends_apart():
    from gaca_agent.integrations.trl import trl_environment

    Env = trl_environment("gaca/Diag-Signs-v0", max_episode_steps=3)
    env = Env()  # TRL constructs with no arguments
    text = env.reset(seed=5, task_id=2, prompt="ignored")
    plain = gym.make("gaca/Diag-Signs-v0", max_episode_steps=3)
    obs, info = plain.reset(seed=5, options={"task_id": 2})
    assert info["task"] in text and obs in text and "rest; walk forward" in text
    for _ in range(3):
        got = env.take_action("rest")
        obs, reward, term, trunc, info = plain.step("rest")
        assert obs in got and env.state_keys[-1] == info["state_key"]
    assert env.truncated and not env.terminated and "out of time" in got
    with pytest.raises(ValueError, match="episode is over"):
        env.take_action("rest")
    Untimed = trl_environment("gaca/Diag-Signs-v0")
    dead = Untimed()
    dead.reset(seed=5, task_id=2)
    while not dead.terminated:  # walk up to a door, then take the wrong one: a dead end
        dead.take_action("open the other door" if "door" in dead.take_action("rest")
                         else "walk forward")
    assert dead.terminated and not dead.truncated and dead.get_reward() == 0.0
    won = Untimed()
    won.reset(seed=1, task_id=0)
    while not won.terminated:
        won.take_action(won.env.unwrapped.expert_action())
    assert won.won and won.get_reward() == 1.0 == won.reward
    with pytest.raises(ValueError, match="tool must be"):
        trl_environment("gaca/Diag-Signs-v0", tool="reset")


@needs_trl
def test_trls_grpo_trainer_trains_two_steps_on_a_gaca_env(tmp_path, tiny_model_path,
                                                          monkeypatch, fresh_accelerate):
    """TRL probes the class (its tool and reward), plays it in its rollout loop and logs
    the env's reward under the class name. The random tiny model rarely writes a tool
    call, so the logged reward is the env's (zero) return: the tool path itself is
    checked above and below through the trainer's own environment pool."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from gaca_agent.integrations.trl import trl_environment

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = qwen2_5_chat_template  # a template TRL can parse tool calls of
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    Env = trl_environment("gaca/Diag-Signs-v0", seed=0)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=64, logging_steps=1,
                      report_to="none", use_cpu=True, save_strategy="no")
    # dataset columns reach reset(): every row asks for task 5 with seed 7
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Play."}]] * 8,
                              "task_id": [5] * 8, "seed": [7] * 8})
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args,
                          train_dataset=rows, environment_factory=Env)
    assert [t.__name__ for t in trainer.tools] == ["take_action"]
    assert trainer.reward_func_names == [Env.__name__]
    trainer.train()
    logged = [h for h in trainer.state.log_history if f"rewards/{Env.__name__}/mean" in h]
    assert len(logged) == 2
    pool = trainer._environment_pool[None]
    assert len(pool) == 4 and all(type(e) is Env for e in pool)
    assert logged[-1][f"rewards/{Env.__name__}/mean"] == pytest.approx(
        np.mean([e.get_reward() for e in pool]))
    start = gym.make("gaca/Diag-Signs-v0").reset(seed=7, options={"task_id": 5})[1]
    for e in pool:  # every rollout was reset by TRL, once a step, as its row asked
        assert e._resets == 2 and e.env.unwrapped.task_id == 5
        assert e.state_keys[0] == start["state_key"]
    e = pool[0]
    text = e.reset()
    assert "Admissible actions" in e.take_action(text.split("Admissible actions: ")[1]
                                                 .split("; ")[0])


# ------------------------------------------------------------------------- verifiers
VERIFIERS = Path(__file__).resolve().parents[1] / ".venv-verifiers" / "bin" / "python"


@pytest.mark.skipif(not VERIFIERS.exists(), reason="needs the verifiers side environment "
                    "(it pins mcp 2, OpenEnv mcp 1): bash scripts/setup_verifiers.sh")
def test_verifiers_own_rollouts_play_a_gaca_env_as_the_gym_env_does(tmp_path):
    """verifiers' Env.run_slot, its null harness (a chat program in a subprocess) and its
    interception play two tasks against a scripted chat server: each reply to a user turn
    is stepped, and the turns, actions, state keys, reward and ends equal a local replay."""
    from gaca_agent.integrations.render import render
    from verifiers_probe import choose

    limit = 11  # task 0 runs out of time (truncated), task 1 reaches the exit (terminated)
    # as for a user who did not activate .venv-verifiers: its uv is on no PATH entry
    no_uv = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                            if d and not (Path(d) / "uv").exists())
    out = subprocess.run([str(VERIFIERS), str(Path(__file__).parent / "verifiers_probe.py"),
                          "--tasks", "2", "--env-kwargs", json.dumps({"max_episode_steps":
                                                                      limit})],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "GACA_PROBE_KEY": "unused", "PATH": no_uv})
    assert out.returncode == 0, out.stderr[-3000:]
    episodes = json.loads(out.stdout.strip().splitlines()[-1])
    assert [e["name"] for e in episodes] == ["gaca/Diag-Signs-v0#0", "gaca/Diag-Signs-v0#1"]
    ends = set()
    for seed, e in enumerate(episodes):
        assert e["ok"] and not e["errors"], e["errors"]
        env = gym.make("gaca/Diag-Signs-v0", max_episode_steps=limit)
        obs, info = env.reset(seed=seed)
        turns, keys, ret = [render(obs, info, task=True)], [info["state_key"]], 0.0
        for k, action in enumerate(e["trace_info"]["actions"]):
            # the model's reply to the k-th user turn it saw is the k-th action stepped
            assert action == choose([{"role": "user", "content": u}
                                     for u in e["users"][:k + 1]], 0)
            obs, r, term, trunc, info = env.step(action)
            ret, keys = ret + r, keys + [info["state_key"]]
            if not (term or trunc):
                turns.append(render(obs, info))
        assert e["users"] == turns
        assert e["trace_info"]["state_keys"] == keys
        assert e["reward"] == pytest.approx(ret)
        assert e["metrics"] == {"won": float(info["won"]), "steps": float(len(keys) - 1),
                                "terminated": float(term), "truncated": float(trunc)}
        ends.add((term, trunc))
    assert (False, True) in ends and any(t for t, _ in ends)


# ------------------------------------------------------------------------- Gymnasium
def test_a_fresh_interpreter_makes_a_gaca_env_with_nothing_imported():
    """Gymnasium 1.x has no env plugin entry point (1.0 removed it): its own way to make
    a third-party env in a fresh interpreter is the ``module:id`` form."""
    import subprocess
    import sys

    code = ("import gymnasium as gym; env = gym.make('gaca_envs:gaca/Diag-Signs-v0'); "
            "obs, info = env.reset(seed=0); print(info['task'], info['admissible_actions'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "follow the sign" in run.stdout and "walk forward" in run.stdout


# ------------------------------------------------------------------- W&B and Trackio
def wandb_records(run_dir):
    """The records of the offline W&B run in ``run_dir``, read from its ``.wandb`` file
    (W&B's own record format: 7-byte header, 32 KiB blocks of checksummed chunks) with
    W&B's own protobuf schema."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, chunks, part = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            chunks.append(part)
    records = []
    for chunk in chunks:
        record = pb.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One iteration of gaca-train (the tiny model, its format warmed up so that some
    actions are valid and returns differ) logged to W&B (offline) and Trackio, its
    rollouts kept with token ids."""
    if not (has_module("wandb") and has_module("trackio") and has_module("torch")):
        pytest.skip("needs wandb, trackio and torch (pip install gaca[integrations])")
    tmp = tmp_path_factory.mktemp("trained")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "TRACKIO_DIR": str(tmp / "trackio")}
    run = subprocess.run(
        [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config", "default",
         f"out_dir={tmp}", "name=logged", "iterations=1", "eval_every=0",
         "env.groups=2", "env.group_size=4", "env.max_live_envs=8", "warmup.bc_steps=40",
         "warmup.bc_episodes=4", "model.max_new_tokens=12", "env.invalid_penalty=-0.1",
         "project=gaca-test", "logging=[wandb,trackio]", "keep_rollouts=tokens"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp / "logged", env


@pytest.mark.xdist_group("trained_run")  # one training run for both (scripts/test.sh)
def test_a_run_logs_the_same_metrics_to_wandb_and_trackio_with_config_and_commit(
        trained_run):
    run_dir, env = trained_run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    names = {k for k, v in rows[-1].items() if isinstance(v, (int, float))}
    assert {"rollout/success", "losses/policy", "adv/weight_mean"} <= names
    assert not (run_dir / "tensorboard").exists()  # only what logging lists
    records = wandb_records(run_dir)
    (meta,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    if commit:  # a git checkout: W&B records its commit, as for any run
        assert meta.git.commit == commit
    assert (meta.display_name, meta.project) == ("logged", "gaca-test")
    config = {u.key or ".".join(u.nested_key): json.loads(u.value_json)
              for u in meta.config.update}
    assert config["algo"]["estimator"] == "gaca" and config["name"] == "logged"
    history = [{i.key or ".".join(i.nested_key): json.loads(i.value_json)
                for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    history = [h for h in history if "iteration" in h]  # W&B may add a final bare record
    assert [h["iteration"] for h in history] == [-1, 0]
    assert {k for k in history[-1] if not k.startswith("_")} == names
    assert history[-1]["losses/policy"] == pytest.approx(rows[-1]["losses/policy"])
    code = ("import sys, json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "m = S.get_all_metrics_for_run('gaca-test', 'logged'); "
            "print(json.dumps([sorted(m), S.get_run_config('gaca-test', 'logged'), "
            "S.get_metric_values('gaca-test', 'logged', 'losses/policy')]))")
    read = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    metrics, tconfig, values = json.loads(read.stdout.strip().splitlines()[-1])
    every = {k for row in rows for k, v in row.items() if isinstance(v, (int, float))}
    assert set(metrics) == every and tconfig["algo"]["estimator"] == "gaca"
    assert [v["step"] for v in values] == [1]  # iteration 0 is step 1 (warm-up: step 0)
    assert values[0]["value"] == pytest.approx(rows[-1]["losses/policy"])


# ------------------------------------------------------------------------- datasets
@pytest.mark.skipif(not has_module("datasets"), reason="needs datasets (gaca[integrations])")
@pytest.mark.xdist_group("trained_run")
def test_gaca_export_writes_a_dataset_that_rescore_and_audit_read_back(trained_run,
                                                                       tmp_path):
    import datasets
    import pyarrow.parquet as pq

    from gaca_agent.analysis.audit import read_records
    from gaca_agent.cli.audit import main as audit
    from gaca_agent.cli.export import main as export
    from gaca_agent.cli.rescore import main as rescore

    run_dir, _ = trained_run
    out = tmp_path / "steps"
    assert export([str(run_dir), "--to", str(out)]) == 0
    assert export([str(run_dir), "--to", str(out)]) == 2  # never over an existing export
    data = datasets.load_from_disk(str(out))
    (rollouts,) = run_dir.glob("rollouts/iter-00000.rank0.jsonl.gz")
    steps = [s for r in read_records(rollouts) if not r["failed"] for s in r["trajectory"]]
    assert len(data) == len(steps) == pq.read_table(out / "steps.parquet").num_rows
    assert set(data["iteration"]) == {0}
    assert data["response"] == [s["response"] for s in steps]
    for row, step in zip(data, steps):  # token ids and the sampler's log-probs, per step
        assert row["response_ids"] == step["response_ids"] and row["prompt_ids"]
        assert len(row["logprobs"]) == len(row["response_ids"]) > 0
        assert all(lp <= 0 for lp in row["logprobs"])
    # the run trained with gaca at the defaults gaca-export scores with: the same numbers
    np.testing.assert_allclose(data["advantage"], data["advantage_gaca"], atol=1e-9)
    np.testing.assert_allclose(data["weight"], data["weight_gaca"], atol=1e-9)
    assert np.std(data["weight_gaca"]) > 0 and np.any(np.array(data["advantage_grpo"]) != 0)
    # the analysis commands read the export as they read the run
    for tool in (rescore, audit):
        assert tool([str(run_dir), "--out", str(tmp_path / f"{tool.__module__}-run")]) == 0
        assert tool([str(out), "--out", str(tmp_path / f"{tool.__module__}-export")]) == 0
    for name in ("rescore", "audit"):
        module = f"gaca_agent.cli.{name}"
        a = json.loads((tmp_path / f"{module}-run" / f"{name}.json").read_text())
        b = json.loads((tmp_path / f"{module}-export" / f"{name}.json").read_text())
        for key in ("source", "paths"):  # where the episodes were read from
            a.pop(key, None), b.pop(key, None)
        assert a == b, name


def test_a_tracker_whose_package_is_missing_is_refused_before_the_run(monkeypatch):
    import importlib.util

    from gaca_agent.config import load_config
    from gaca_agent.config.checks import InputError, check_config

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(InputError, match="pip install trackio"):
        check_config(load_config("default", ["logging=[tensorboard,trackio]"]))
    with pytest.raises(ValueError, match="logging\\[0\\] must be one of"):
        load_config("default", ["logging=[mlflow]"])


@pytest.mark.skipif(not has_module("datasets"), reason="needs datasets (gaca[integrations])")
def test_gaca_export_of_an_evaluation_scores_its_groups_as_rescore_does(tmp_path):
    import datasets

    from gaca_agent.cli.eval import main as evaluate
    from gaca_agent.cli.export import main as export
    from gaca_agent.cli.rescore import main as rescore

    assert evaluate(["--env", "gaca/Diag-Signs-v0", "--policy", "random", "--episodes", "3",
                     "--group-size", "4", "--seed", "1", "--out", str(tmp_path / "ev")]) == 0
    assert export([str(tmp_path / "ev"), "--to", str(tmp_path / "ds"),
                   "--estimators", "grpo,gigpo"]) == 0
    data = datasets.load_from_disk(str(tmp_path / "ds"))
    assert set(data["iteration"]) == {-1} and len(set(data["group"])) == 3
    assert np.isnan(data["advantage"]).all()  # an evaluation trains on nothing
    assert "advantage_gaca" not in data.column_names and np.std(data["advantage_gigpo"]) > 0
    for path, out in ((tmp_path / "ev", "a"), (tmp_path / "ds", "b")):
        assert rescore([str(path), "--estimators", "grpo,gigpo", "--out",
                        str(tmp_path / out)]) == 0
    a, b = (json.loads((tmp_path / x / "rescore.json").read_text()) for x in "ab")
    for key in ("source", "paths"):
        a.pop(key, None), b.pop(key, None)
    assert a == b
