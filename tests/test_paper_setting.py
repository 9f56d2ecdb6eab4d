"""GiGPO's published setting (verl-agent's scripts): advantages equal an independent
reference of verl-agent's computation, verl-agent's prompt modules work unmodified, the
optimizer-step count and the paper configs' resolved setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gaca_agent.advantages import compute
from gaca_agent.policies.scripted import ExpertPolicy
from gaca_agent.collect.collector import Collector
from gaca_agent.config import EnvSection
from gaca_agent.generate.prompts import PromptBuilder, verl_format_valid
from gaca_agent.steps import step_batch
from gaca_agent.types import ActionOutput, Turn

ROOT = Path(__file__).resolve().parents[1]


class MixedPolicy:
    """Expert actions, but some responses lack <think> (verl-agent calls them invalid,
    their action is admissible) and some name an inadmissible action (well-formed)."""

    needs_expert = True

    def act(self, turns):
        out = []
        for turn in turns:
            kind = (turn.key or 0) % 5
            action = ExpertPolicy().act([turn])[0].action
            if kind == 0:
                out.append(ActionOutput(f"<action>{action}</action>", action))
            elif kind == 1:
                out.append(ActionOutput("<think>hm</think><action>dance</action>", "dance"))
            else:
                out.append(ActionOutput(f"<think>go</think><action>{action}</action>", action))
        return out


def verl_reference(rows, gamma: float, omega: float, std: bool, step_level: bool):
    """verl-agent's GRPO/GiGPO advantages, written from the formulas: every row's score is
    its episode's reward sum minus 0.1 if the row is invalid; episode statistics over the
    group's rows; the step reward is the discounted return minus the same 0.1; anchors are
    the exact observation texts within a group; a group of one has mean 0 and std 1 at the
    episode level, mean = itself and std 1 at the step level."""
    eps = 1e-6
    by_traj = defaultdict(list)
    for r in rows:
        by_traj[r["traj"]].append(r)
    ret, total = {}, {}
    for traj, rs in by_traj.items():
        rs.sort(key=lambda r: r["t"])
        running = 0.0
        for r in reversed(rs):
            running = r["reward"] + gamma * running
            ret[(traj, r["t"])] = running
        total[traj] = sum(r["reward"] for r in rs)

    def normalise(values, keys, singleton_mean_is_value):
        groups = defaultdict(list)
        for v, k in zip(values, keys):
            groups[k].append(v)
        out = []
        for v, k in zip(values, keys):
            members = groups[k]
            if len(members) == 1:
                mean, sd = (v if singleton_mean_is_value else 0.0), 1.0
            else:
                mean, sd = float(np.mean(members)), float(np.std(members, ddof=1))
            out.append((v - mean) / (sd + eps) if std else v - mean)
        return np.asarray(out)

    pen = [0.1 * (not r["valid"]) for r in rows]
    scores = [total[r["traj"]] - p for r, p in zip(rows, pen)]
    a_e = normalise(scores, [r["group"] for r in rows], False)
    if not step_level:
        return a_e
    steps = [ret[(r["traj"], r["t"])] - p for r, p in zip(rows, pen)]
    a_s = normalise(steps, [(r["group"], r["obs"]) for r in rows], True)
    return a_e + omega * a_s


@pytest.fixture(scope="module")
def paper_rollout():
    collector = Collector(EnvSection(id="gaca/Diag-Corridor-v0", kwargs={"split": "test"},
                                     max_live_envs=16, invalid_penalty=-0.1,
                                     invalid_definition="format", penalty_mode="row",
                                     reward="success", reward_scale=10.0))
    try:
        return collector.run(MixedPolicy(), [(k, 100 + k) for k in range(4)], group_size=4)
    finally:
        collector.close()


@pytest.mark.parametrize("estimator, std", [("grpo", True), ("gigpo", True), ("gigpo", False)])
def test_advantages_equal_verl_agents_computation(paper_rollout, estimator, std):
    table = paper_rollout.training_table()
    raw = [{"group": int(table["group"][i]), "traj": int(table["traj"][i]),
            "t": int(table["t"][i]), "obs": table["observation"][i],
            "reward": 10.0 * float(table["env_reward"][i]),
            "valid": verl_format_valid(table["response"][i])} for i in range(len(table))]
    assert any(not r["valid"] for r in raw) and any(r["reward"] == 10.0 for r in raw)
    assert (~table["action_valid"]).any()  # inadmissible but well-formed rows exist too
    assert all(r["valid"] for r, ok in zip(raw, table["action_valid"]) if not ok)
    assert table["penalty"].min() == pytest.approx(-0.1) and table["reward"].max() == 10.0
    params = {"norm": "std" if std else "mean", "episode_stats": "steps"}
    if estimator == "gigpo":
        params.update(gamma=0.95, omega=1.0)
    ours, _ = compute(estimator, step_batch(table.scalars(anchor="observation")), **params)
    ref = verl_reference(raw, 0.95, 1.0, std, estimator == "gigpo")
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)


def test_gaca_with_kappa_zero_is_gigpo_in_the_paper_setting(paper_rollout):
    batch = step_batch(paper_rollout.training_table().scalars(anchor="observation"))
    common = {"gamma": 0.95, "omega": 1.0, "norm": "std", "episode_stats": "steps"}
    gigpo, _ = compute("gigpo", batch, **common)
    gaca, _ = compute("gaca", batch, kappa=0.0, **common)
    np.testing.assert_array_equal(gaca, gigpo)


VERL_STYLE = '''
# A prompt module in verl-agent's form (the same field names), written for this test.
SHOP_TEMPLATE_NO_HIS = """
Shop for: {task_description}.
Page now: {current_observation}.
Choices:
[
{available_actions}
].
"""

SHOP_TEMPLATE = """
Shop for: {task_description}.
{step_count} step(s) done; the last {history_length}: {action_history}
Step {current_step}, page now: {current_observation}.
Choices:
[
{available_actions}
].
"""
'''


def test_verl_agent_prompt_modules_work_unmodified(tmp_path):
    module = tmp_path / "webshop_prompts.py"
    module.write_text(VERL_STYLE)
    builder = PromptBuilder(history_length=2, template_file=str(module))
    page = "WebShop [SEP] Instruction: [SEP] a red mug [SEP] Search"
    first = builder.build(Turn("gaca/WebShop-v0", "a red mug", page, ("search[<query>]",),
                               family="webshop"))
    assert first == ("\nShop for: a red mug.\nPage now: 'Search'.\nChoices:\n[\n"
                     "'search[<your query>]',\n].\n")
    results = "Instruction: [SEP] a red mug [SEP] Back to Search [SEP] Page 1 [SEP] B01"
    later = builder.build(Turn("gaca/WebShop-v0", "a red mug", results,
                               ("click[back to search]", "click[b01]"),
                               ((page, "search[red mug]"),), 1, family="webshop"))
    # past pages are stored formatted and quoted again, as verl-agent's memory does
    assert later == ("\nShop for: a red mug.\n1 step(s) done; the last 1: [Observation 1: "
                     "''Search'', Action 1: 'search[red mug]']\nStep 2, page now: 'Back to "
                     "Search' [SEP] 'Page 1' [SEP] 'B01'.\nChoices:\n[\n'click[back to "
                     "search]',\n'click[b01]',\n].\n")
    broken = tmp_path / "broken.py"
    broken.write_text('X_TEMPLATE = "{current_observation} {nope}"\nX_TEMPLATE_NO_HIS = "{current_observation}"\n')
    with pytest.raises(ValueError, match="not one of"):
        PromptBuilder(template_file=str(broken)).build(Turn("e", "t", "o", ("a",)))
    padded = tmp_path / "padded.txt"  # str.format's own format specs are fields too
    padded.write_text("[{step_count:>3}] {current_observation:.5}")
    assert PromptBuilder(template_file=str(padded)).build(
        Turn("e", "t", "observed", ("a",))) == "[  0] obser"
    bare = tmp_path / "bare.txt"
    bare.write_text("{task_description}: current_observation")
    with pytest.raises(ValueError, match="bare.txt lacks the field 'current_observation'"):
        PromptBuilder(template_file=str(bare)).build(Turn("e", "t", "o", ("a",)))


def test_builtin_prompts_follow_verl_agents_structure():
    builder = PromptBuilder(history_length=2)
    history = (("You are in the middle of a room.", "go to desk 1"),
               ("You arrive at desk 1.", "take mug 1 from desk 1"),
               ("You pick up the mug 1.", "go to sinkbasin 1"))
    turn = Turn("gaca/ALFWorld-v0", "put a clean mug on desk", "You arrive at sinkbasin 1.",
                ("clean mug 1 with sinkbasin 1", "help", "look"), history, 3, family="alfworld")
    text = builder.build(turn)
    assert ("[Observation 2: 'You arrive at desk 1.', Action 2: 'take mug 1 from desk 1']\n"
            "[Observation 3: 'You pick up the mug 1.', Action 3: 'go to sinkbasin 1']") in text
    assert "Observation 1" not in text and "[Observation" in text.split("after each are: ")[1][:13]
    assert "['clean mug 1 with sinkbasin 1'\n 'look']" in text and "help" not in text
    assert "step 4" in text and "3 step(s)" in text
    first = builder.build(Turn("gaca/ALFWorld-v0", "put a clean mug on desk", "Welcome",
                               ("look",), (), 0, family="alfworld"))
    assert "Observation 1" not in first and "step(s)" not in first and "Welcome" in first


def test_optimizer_steps_follow_mini_batch_rows(tiny_model_path):
    pytest.importorskip("accelerate")
    from test_learner import make_learner, samples

    for rows, epochs, expected in ((3, 1, 3), (3, 2, 6), (8, 1, 1), (100, 1, 1)):
        learner, tok = make_learner(tiny_model_path, mini_batch_rows=rows, ppo_epochs=epochs)
        metrics = learner.update(*samples(tok, n=8))
        assert metrics["train/opt_steps"] == expected, (rows, epochs)


def test_paper_config_dry_run_shows_verl_agents_setting():
    # HF_HUB_OFFLINE=0: the Qwen name is taken on trust (offline, the dry-run refuses a
    # model the cache does not hold); nothing is downloaded by a dry-run
    online = {**os.environ, "HF_HUB_OFFLINE": "0"}
    run = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--config",
                          str(ROOT / "gaca_agent/configs/paper/alfworld_qwen2_5_1_5b_gigpo.yaml"),
                          "--dry-run"], capture_output=True, text=True, timeout=120, env=online)
    assert run.returncode == 0, run.stderr
    rows = re.findall(r"\n  (\S[^\n]*?)  +(\S[^\n]*)\n +\(verl-agent: ([^\n]*)\)", run.stdout)
    assert len(rows) == 13
    for name, ours, theirs in rows:
        if name in ("prompts", "rollouts and weights"):
            continue  # our own words in verl-agent's structure; vLLM is not installable here
        assert ours == theirs.replace(", similarity off", ""), name
    ours_default = subprocess.run([sys.executable, "-m", "gaca_agent.cli.train", "--config",
                                   str(ROOT / "gaca_agent/configs/default.yaml"), "--dry-run"],
                                  capture_output=True, text=True, timeout=120).stdout
    assert "canonical state key" in ours_default and "over the group's trajectories" in ours_default


def test_the_setting_table_names_generated_held_out_games_and_no_evaluation():
    """A run on generated games names them as its held-out split, and eval_every 0 reads
    as the final evaluation only (not "every 0 iterations")."""
    from gaca_agent.analysis.setting import setting_rows
    from gaca_agent.config import load_config

    path = ROOT / "gaca_agent/configs/cpu_lm/textworld.yaml"
    rows = {name: ours for name, ours, _ in setting_rows(load_config(path))}
    assert rows["evaluation split"] == "32 generated games from seed 1000000"
    assert rows["evaluation during training"] == "32 episodes, temperature 0.4, every 5 iterations"
    rows = {name: ours for name, ours, _ in setting_rows(load_config(path, ["eval_every=0"]))}
    assert rows["evaluation during training"] == (
        "the final weights only (eval_every: 0), 32 episodes, temperature 0.4")
    alfworld = load_config(ROOT / "gaca_agent/configs/cpu_lm/alfworld.yaml")
    assert dict((n, o) for n, o, _ in setting_rows(alfworld))["evaluation split"] == (
        alfworld.env.eval_kwargs["split"])


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "gaca_agent/configs/paper").glob("*.yaml")))
def test_every_paper_config_loads(path):
    """Each paper config passes the typed checks; the server-LoRA variants differ from
    their base config only in the rollout engine, LoRA, the learning rate and TIS; the
    server-full variants (GiGPO's full fine-tuning) only in the rollout engine and TIS."""
    from gaca_agent.config import load_config, to_dict

    cfg = load_config(ROOT / "gaca_agent/configs/paper" / path)
    if path.endswith("_async.yaml"):  # its server-full base, asynchronous, broadcast
        base = to_dict(load_config(ROOT / "gaca_agent/configs/paper" /
                                   path.replace("_async", "")))
        ours = to_dict(cfg)
        assert cfg.max_staleness == 1 and cfg.server.weight_transfer == "broadcast"
        assert {k for k in ours if ours[k] != base[k]} == {"name", "max_staleness", "server"}
        changed = {k for k in ours["server"] if ours["server"][k] != base["server"][k]}
        assert "weight_transfer" in changed and changed <= {
            "weight_transfer", "transfer_host", "transfer_port", "bucket_mb",
            "transfer_timeout_s"}
        return
    variant = next((v for v in ("_server_lora", "_server_full") if path.endswith(v + ".yaml")),
                   None)
    if variant is None:
        return
    base = to_dict(load_config(ROOT / "gaca_agent/configs/paper" / path.replace(variant, "")))
    ours = to_dict(cfg)
    assert cfg.model.engine == "server" and cfg.learner.tis_cap
    assert ours["env"] == base["env"] and ours["algo"] == base["algo"]
    changed = {k for k in ours["learner"] if ours["learner"][k] != base["learner"][k]}
    if variant == "_server_lora":
        assert cfg.learner.lora_r > 0
        assert changed <= {"lr", "lora_r", "lora_alpha", "lora_targets", "tis_cap", "fsdp"}
    else:
        assert cfg.learner.lora_r == 0 and changed == {"tis_cap"}
        assert cfg.server.sync_dtype == "bfloat16"


def test_webshop_paper_config_names_the_missing_files(tmp_path):
    import gymnasium as gym

    pytest.importorskip("bm25s")
    with pytest.raises(FileNotFoundError, match=r"items_shuffle_1000.json.*setup.sh -d small"):
        gym.make("gaca/WebShop-v0", split="train_dev",
                 catalog=str(tmp_path / "items_shuffle_1000.json"))
    env = gym.make("gaca/WebShop-v0", split="train_dev")
    assert env.unwrapped.num_tasks == len(env.unwrapped.world.goals) - 500


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "gaca_agent/configs/paper")
                                        .glob("*_ecpo.yaml")))
def test_ecpo_paper_configs_are_gigpos_setting_with_ecpo(path):
    """ECPO's paper configs (its paper trains in GiGPO's setting): GiGPO's file with the
    estimator swapped for ECPO at its defaults, nothing else."""
    from gaca_agent.config import load_config, to_dict

    ours = to_dict(load_config(ROOT / "gaca_agent/configs/paper" / path))
    base = to_dict(load_config(ROOT / "gaca_agent/configs/paper" /
                               path.replace("_ecpo", "_gigpo")))
    assert {k for k in ours if ours[k] != base[k]} == {"name", "algo"}
    assert ours["algo"]["estimator"] == "ecpo"
    assert ours["algo"]["params"] == {**base["algo"]["params"], "kappa": 2.0, "gate": True}
    assert {k for k in ours["algo"] if ours["algo"][k] != base["algo"][k]} == {
        "estimator", "params"}
