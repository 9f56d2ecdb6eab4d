"""The expert warm-up's data on every suite: each transcript pair is the prompt RL builds
for that turn (the policy's own chat-templated prompt ids, history included) and the
expert's action in the response format; and ``warmup.source: expert`` in a run."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import alfworld_data_or_skip, has_module

pytestmark = pytest.mark.skipif(not has_module("torch"), reason="needs torch")


class RecordingExpert:
    """The expert policy, keeping every turn it was shown (with its expert action)."""

    needs_expert = True

    def __init__(self) -> None:
        from gaca_agent.policies.scripted import ExpertPolicy

        self.expert, self.turns = ExpertPolicy(), []

    def act(self, turns):
        self.turns += list(turns)
        return self.expert.act(turns)


def suite(name, request):
    """(env id, env kwargs) of one suite, or a skip naming what is missing."""
    if name == "alfworld":
        return "gaca/ALFWorld-v0", {"split": "valid_seen", "data_dir": alfworld_data_or_skip()}
    if name == "textworld":
        game = request.getfixturevalue("tiny_textworld_game")
        return "gaca/TextWorld-v0", {"game": game}
    if name == "scienceworld":
        import shutil

        if not has_module("scienceworld") or shutil.which("java") is None:
            pytest.skip("needs scienceworld and Java (pip install -e '.[scienceworld]')")
        return "gaca/ScienceWorld-v0", {"split": "test", "task_types": "boil",
                                        "max_episode_steps": 12}
    if not has_module("bm25s"):
        pytest.skip("needs the webshop extra (pip install -e '.[webshop]')")
    return "gaca/WebShop-v0", {"split": "test"}


@pytest.mark.parametrize("name", ["alfworld", "textworld", "scienceworld", "webshop"])
def test_expert_transcripts_are_the_rl_prompt_and_the_experts_action(name, request,
                                                                     tiny_model_path):
    from transformers import AutoTokenizer

    from gaca_agent.collect.collector import Collector
    from gaca_agent.config import EnvSection
    from gaca_agent.generate.prompts import format_response
    from gaca_agent.generate.transcripts import transcripts
    from gaca_agent.policies.hf import HFPolicy

    env_id, kwargs = suite(name, request)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    collector = Collector(EnvSection(id=env_id, kwargs=kwargs, workers=0, history_length=2))
    expert = RecordingExpert()
    try:
        second = 0 if name == "textworld" else 1  # one TextWorld game: two episodes of it
        rollout = collector.run(expert, [(0, 1), (second, 2)], 1)
    finally:
        collector.close()
    pairs = transcripts(rollout, env_id, collector.family, collector.prompts, tokenizer)
    rl = HFPolicy(tiny_model_path, tokenizer, history_length=2)  # RL's prompt for a turn
    by_step = sorted(expert.turns, key=lambda t: (t.episode, t.step))
    assert len(pairs) == len(by_step) == len(rollout.table) >= 2
    for (prompt, response), turn in zip(pairs, by_step):
        assert turn.expert_action  # every turn had the expert's action
        assert tuple(prompt) == rl.prompt_ids(turn)
        assert tokenizer.decode(response) == format_response(turn.expert_action) + \
            tokenizer.eos_token
    assert any(t.step >= 2 and len(t.history) >= 2 for t in by_step) or \
        max(t.step for t in by_step) < 2  # histories are in the prompts when episodes run on
    if name != "scienceworld":  # its episodes are cut at 12 steps here
        assert all(ep.won for ep in rollout.episodes)


def test_a_run_warms_up_on_the_expert_and_evaluates_before_and_after(tmp_path):
    """``warmup.source: expert`` with ``warmup.eval_before``: the warm-up row has the
    zero-shot evaluation, the expert's success on its transcripts (1 on Diag) and the
    evaluation after it; cloning the expert raises held-out success."""
    import json

    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train

    cfg = load_config("gaca_agent/configs/default.yaml", [
        "iterations=1", "eval_every=1", "checkpoint_every=0", "env.groups=2",
        "env.group_size=2", "env.workers=0", "warmup.source=expert", "warmup.eval_before=true",
        "warmup.bc_steps=60", "warmup.bc_episodes=16", "env.eval_episodes=16",
        f"out_dir={tmp_path}", "name=expert", "keep_rollouts=false"])
    run = train(cfg, progress=False)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    warm = next(r for r in rows if r["iteration"] == -1)
    assert warm["warmup/expert_success"] == 1.0
    assert warm["eval/success"] > warm["eval_before/success"] + 0.3
    # both evaluations are kept as gaca-eval writes one, labelled by stage
    for folder, key, label in (("zero_shot_eval", "eval_before/success", "zero-shot"),
                               ("warmup_eval", "eval/success", "warmed-up")):
        result = json.loads((run / folder / "results.json").read_text())
        assert (result["n"], result["policy"]) == (16, label), folder
        assert result["success_rate"] == warm[key], folder


@pytest.mark.slow  # a JVM, ALFWorld's games and WebShop's index, one iteration each
@pytest.mark.parametrize("name", ["alfworld", "webshop", "scienceworld", "textworld"])
def test_each_cpu_lm_config_runs_end_to_end_in_one_iteration(name, request, tmp_path,
                                                            monkeypatch):
    """Each suite's SmolLM2 CPU config, shrunk to one iteration of one group and with the
    tiny model of SmolLM2's architecture (Llama): zero-shot, warm-up on the expert, RL and
    the final evaluation all run, in bf16 with fp32 masters (forced: the configs' ``auto``
    takes fp32 on a CPU without bf16 units, and the bf16 path must stay tested there)."""
    import json

    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train

    suite(name, request)  # skips when the suite's package or data is missing
    shrink = []
    if name == "textworld":  # a few games, made into the test's own cache
        monkeypatch.setenv("GACA_CACHE", str(tmp_path / "cache"))
        shrink = ["env.kwargs.generate.count=3", "env.eval_kwargs.generate.count=2",
                  "warmup.env_kwargs.generate.count=2"]
    cfg = load_config(f"gaca_agent/configs/cpu_lm/{name}.yaml", shrink + [
        "model.path=tiny", "iterations=1", "eval_every=1", "env.groups=1", "env.group_size=2",
        "env.eval_episodes=2", "env.workers=0", "warmup.bc_steps=2", "warmup.bc_batch=2",
        "warmup.bc_episodes=2", "learner.bf16=true", f"out_dir={tmp_path}"])
    assert cfg.warmup.source == "expert" and cfg.warmup.eval_before
    run = train(cfg, progress=False)
    rows = {r["iteration"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                           .splitlines())}
    assert {"eval_before/success", "eval/success", "warmup/expert_success"} <= set(rows[-1])
    assert "eval/success" in rows[0] and rows[0]["train/rollout_logprob_gap"] < 0.05
    assert json.loads((run / "final_eval" / "results.json").read_text())["n"] == 2


def test_the_warm_up_sees_every_pair_once_a_pass():
    """warmup.bc_steps x bc_batch rows are whole shuffled passes over the expert's pairs:
    an epoch's worth of steps trains on every pair once (rows drawn independently left
    about a third of ScienceWorld's 684 unseen), and passes are shuffled afresh."""
    from gaca_agent.learner.warmup import epoch_batches

    rng = np.random.default_rng(0)
    batches = epoch_batches(10, 4, 5, rng)  # 20 rows: two passes over 10 pairs
    assert batches.shape == (5, 4)
    first, second = batches.reshape(-1)[:10], batches.reshape(-1)[10:]
    assert sorted(first) == sorted(second) == list(range(10))
    assert list(first) != list(second) and list(first) != list(range(10))
    part = epoch_batches(684, 8, 40, np.random.default_rng(0)).reshape(-1)  # 320 of 684
    assert len(set(part)) == 320
    assert epoch_batches(5, 3, 0, rng).shape == (0, 3)
    with pytest.raises(ValueError, match="no .prompt, response. pairs"):
        epoch_batches(0, 8, 1, rng)


def test_the_warm_ups_loss_is_the_response_tokens_cross_entropy(tiny_model_path):
    """behaviour_clone's loss (computed a chunk of logits at a time) equals the model's
    own cross-entropy over the response tokens of right-padded prompt + response rows,
    and its first step is taken on that loss (the first loss reported is it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.learner.batch import pad_batch
    from gaca_agent.learner.warmup import behaviour_clone, epoch_batches, pair_table

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).float()
    pairs = [([5, 6, 7, 8, 9], [10, 11, tokenizer.eos_token_id]),
             ([12, 13], [14, 15, 16, 17, tokenizer.eos_token_id]),
             ([18, 19, 20, 21], [22, tokenizer.eos_token_id])]
    # the rows behaviour_clone's first step takes (its seed's generator)
    drawn = epoch_batches(len(pairs), 3, 2, np.random.default_rng(3))[0]
    rng_batch = [pairs[i] for i in drawn]
    b = pad_batch(pair_table(pairs), drawn, tokenizer.pad_token_id, "cpu")
    labels = torch.full_like(b["input_ids"], -100)
    for row, (p, r) in enumerate(rng_batch):
        labels[row, len(p):len(p) + len(r)] = torch.tensor(r)
    with torch.no_grad():
        expected = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         labels=labels).loss.item()
    for micro in (None, 2, 1):  # the whole batch, or its gradient accumulated
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path).float()
        got = behaviour_clone(model, tokenizer, pairs, steps=2, batch=3, lr=1e-3, seed=3,
                              device=torch.device("cpu"), micro_batch=micro)
        assert got["warmup/first_loss"] == pytest.approx(expected, rel=1e-5)
        assert got["warmup/last_loss"] < got["warmup/first_loss"]  # the step lowered it
        second = got["warmup/last_loss"] * 2 - got["warmup/first_loss"]  # mean of the two
        if micro is None:
            whole = second
        assert second == pytest.approx(whole, rel=1e-4)  # the same step either way


def test_the_warm_ups_micro_batches_hold_rows_of_similar_length(tiny_model_path):
    """A step's rows go into micro-batches by length (each is padded to its longest
    row), whatever order the shuffled pass drew them in."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.learner.warmup import behaviour_clone

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).float()
    eos = tokenizer.eos_token_id
    pairs = [([5] * 40, [6, eos]), ([7] * 3, [8, eos]), ([9] * 41, [10, eos]),
             ([11] * 4, [12, eos])]
    widths: list[int] = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    behaviour_clone(model, tokenizer, pairs, steps=3, batch=4, lr=1e-3, seed=0,
                    device=torch.device("cpu"), micro_batch=2)
    assert widths == [6, 43] * 3  # the two short rows together, then the two long ones


def test_a_bf16_warm_up_trains_the_weights_it_computes_with(tiny_model_path):
    """Under the learner's bf16 autocast (learner.bf16) the warm-up reaches what fp32
    reaches: each step computes with the weights the last step made. (An autocast region
    around all the steps keeps its first bf16 casts of the weights: the reported loss
    falls while the model itself does not learn; the first ALFWorld runs did that.)"""
    import functools

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gaca_agent.learner.batch import pad_batch
    from gaca_agent.learner.warmup import behaviour_clone, pair_table

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    pairs = [([5, 6, 7, 8, 9], [10, 11, tokenizer.eos_token_id]),
             ([12, 13], [14, 15, 16, 17, tokenizer.eos_token_id])]
    b = pad_batch(pair_table(pairs), np.arange(len(pairs)), tokenizer.pad_token_id, "cpu")
    labels = torch.full_like(b["input_ids"], -100)
    for row, (p, r) in enumerate(pairs):
        labels[row, len(p):len(p) + len(r)] = torch.tensor(r)
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    final = {}
    for name, autocast in (("fp32", None), ("bf16", bf16)):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path).float()
        with torch.no_grad():
            start = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                          labels=labels).loss.item()
        behaviour_clone(model, tokenizer, pairs, steps=20, batch=2, lr=1e-2, seed=0,
                        device=torch.device("cpu"),
                        **({"autocast": autocast} if autocast else {}))
        with torch.no_grad():
            final[name] = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                labels=labels).loss.item()
    assert final["fp32"] < 0.5 * start
    assert final["bf16"] == pytest.approx(final["fp32"], rel=0.25, abs=0.05)


@pytest.mark.skipif(not has_module("textworld"),
                    reason="needs textworld (pip install -e '.[alfworld]')")
def test_the_warm_up_can_play_tasks_rl_never_draws(tmp_path, monkeypatch, fresh_accelerate):
    """warmup.env_kwargs: the warm-up's expert episodes are played on those kwargs (over
    env.kwargs), here other generated TextWorld games, and RL's on env.kwargs' games."""
    import json

    import gymnasium as gym
    import yaml

    import gaca_agent.generate.transcripts as transcripts_module
    from gaca_agent.config import load_config
    from gaca_agent.training.loop import train

    monkeypatch.setenv("GACA_CACHE", str(tmp_path / "cache"))
    spec = "{count: 3, seed: %d, rooms: 2, objects: 3, quest_length: 2}"
    seen, real = [], transcripts_module.transcripts

    def recording(rollout, *args, **kwargs):
        seen.extend(ep.task for ep in rollout.episodes)
        return real(rollout, *args, **kwargs)

    monkeypatch.setattr(transcripts_module, "transcripts", recording)
    cfg = load_config("gaca_agent/configs/cpu_lm/textworld.yaml", [
        f"env.kwargs.generate={spec % 0}", f"env.eval_kwargs.generate={spec % 0}",
        f"warmup.env_kwargs={{generate: {spec % 100}}}", "model.path=tiny", "iterations=1",
        "eval_every=0", "warmup.eval_before=false", "env.groups=1", "env.group_size=2",
        "env.workers=0", "warmup.bc_steps=1", "warmup.bc_batch=2", "warmup.bc_episodes=3",
        f"out_dir={tmp_path}", "keep_rollouts=false"])
    run = train(cfg, progress=False)

    def objectives(seed):
        env = gym.make("gaca/TextWorld-v0", generate=yaml.safe_load(spec % seed))
        found = {env.reset(options={"task_id": k})[1]["task"] for k in range(3)}
        env.close()
        return found

    assert len(seen) == 3 and set(seen) == objectives(100)  # each of its 3 games once
    trained = {json.loads(line)["task"] for line in
               (run / "train_episodes.jsonl").read_text().splitlines()}
    assert trained and trained <= objectives(0) and not trained & objectives(100)


def test_a_bad_warm_up_env_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """The warm-up's env kwargs are checked with the training and held-out ones
    (gaca-train and its --dry-run), so a bad one stops the run before it starts."""
    from gaca_agent.config import load_config
    from gaca_agent.config.checks import InputError, check_config

    if not has_module("textworld"):
        pytest.skip("needs textworld (pip install -e '.[alfworld]')")
    monkeypatch.setenv("GACA_CACHE", str(tmp_path))
    small = ["env.kwargs.generate.count=1", "env.eval_kwargs.generate.count=1",
             "model.path=tiny"]
    bad = load_config("gaca_agent/configs/cpu_lm/textworld.yaml",
                      small + ["warmup.env_kwargs={generate: {rooms: 0}}"])
    with pytest.raises(InputError, match=r"generate.rooms must be an integer >= 1, got 0"):
        check_config(bad)
    skipped = load_config("gaca_agent/configs/cpu_lm/textworld.yaml", small + [
        "warmup.env_kwargs={generate: {rooms: 0}}", "warmup.bc_steps=0"])
    check_config(skipped)  # no warm-up: its kwargs are not used, so not checked
