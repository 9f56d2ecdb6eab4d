"""The collector (worker processes, failures) and gaca-eval (results, resume, suites)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from gaca_agent.eval.evaluate import Evaluation, evaluate, plan
from gaca_agent.policies import make_policy
from gaca_agent.collect.collector import Collector
from gaca_agent.config import EnvSection
from gaca_agent.generate.prompts import PromptBuilder, parse_response
from gaca_agent.steps import step_batch
from gaca_agent.types import Turn

from conftest import alfworld_data_or_skip, has_module


def test_parse_and_prompt():
    assert parse_response("<think>hm</think><action> go to  desk 1 </action>") == \
        ("go to desk 1", True)
    assert parse_response("I would go to desk 1") == ("", False)
    assert parse_response("<action></action>") == ("", False)
    turn = Turn("gaca/ALFWorld-v0", "put a mug in the sink", "You see a mug.",
                ("take mug 1", "look"), (("start", "look"), ("You look.", "go to desk 1")),
                2, family="alfworld")
    text = PromptBuilder(history_length=1).build(turn)
    assert "put a mug in the sink" in text and "'take mug 1'\n 'look'" in text
    assert "Action 2: 'go to desk 1'" in text and "Action 1" not in text
    assert "<action> </action>" in text


def test_groups_share_start_and_rows_cover_every_step():
    collector = Collector(EnvSection(id="gaca/Diag-Slippery-v0", kwargs={"split": "test"},
                                     workers=2, max_live_envs=6, invalid_penalty=0.0))
    try:
        rollout = collector.run(make_policy("random", seed=1), [(0, 5), (3, 9)], group_size=4)
    finally:
        collector.close()
    episodes, table = rollout.episodes, rollout.table
    assert [(e.group, e.traj) for e in episodes] == [(g, g * 4 + i) for g in range(2)
                                                   for i in range(4)]
    for g in range(2):
        starts = {table["state_key"][e.rows[0]] for e in episodes if e.group == g}
        assert len(starts) == 1  # a group starts from one state
    assert len(table) == sum(e.length for e in episodes)
    for e, ep in enumerate(episodes):  # an episode's rows: contiguous, in step order
        assert list(table["episode"][ep.rows]) == [e] * ep.length
        assert list(table["t"][ep.rows]) == list(range(ep.length))
        last = ep.rows[-1]
        assert table["terminal"][last] or table["truncated"][last]
    batch = step_batch(rollout.training_table().scalars())
    assert set(batch.traj.tolist()) == set(range(8)) and len(batch.t) == len(table)
    assert not any(e.failed for e in episodes)


def test_recycling_waits_for_live_episodes():
    """A worker due for recycling is replaced only once none of its envs is mid-episode:
    no episode is lost (one worker holding all four live envs, recycled every 3 resets;
    random play on the slippery world, so episodes end at different steps)."""
    collector = Collector(EnvSection(id="gaca/Diag-Slippery-v0", kwargs={"split": "test"},
                                     workers=1, max_live_envs=4, recycle_after=3,
                                     invalid_penalty=0.0))
    try:
        rollout = collector.run(make_policy("random", seed=3), [(k % 16, k) for k in range(12)], 1)
        recycles = collector.pool.recycles
    finally:
        collector.close()
    lengths = {e.length for e in rollout.episodes}
    assert recycles >= 2 and len(lengths) > 2
    assert not any(e.failed for e in rollout.episodes), [e.error for e in rollout.episodes]
    assert all(e.length > 0 for e in rollout.episodes)


class KillOnce:
    """A policy that kills one env worker process in the middle of collection."""

    needs_expert = True

    def __init__(self, collector):
        self.collector, self.calls = collector, 0

    def act(self, turns):
        self.calls += 1
        if self.calls == 3:
            os.kill(self.collector.pool.pids()[0], signal.SIGKILL)
        return make_policy("expert").act(turns)


def test_killed_worker_is_restarted_and_its_episodes_marked_failed():
    collector = Collector(EnvSection(id="gaca/Diag-Corridor-v0", kwargs={"split": "test"},
                                     workers=2, max_live_envs=4, timeout_s=30,
                                     invalid_penalty=0.0))
    try:
        rollout = collector.run(KillOnce(collector), [(k, k) for k in range(6)], 1)
        episodes = rollout.episodes
        restarts = collector.pool.restarts
        again = collector.run(make_policy("expert"), [(0, 0)], 1).episodes
    finally:
        collector.close()
    assert len(episodes) == 6 and restarts >= 1
    failed = [e for e in episodes if e.failed]
    assert failed and all("died" in e.error for e in failed)
    assert all(e.won for e in episodes if not e.failed)
    assert again[0].won  # the restarted worker serves new episodes
    # the learner trains on the whole episodes only: a failed one's partial rows are out
    train = rollout.training_table()
    assert len(train) == sum(e.length for e in episodes if not e.failed) < len(rollout.table)
    assert not train["failed"].any()


def test_eval_all_covers_each_task_once_and_resumes(tmp_path):
    out = tmp_path / "eval"
    res = evaluate(Evaluation("gaca/Diag-Corridor-v0", "expert", "all", {"split": "test"},
                              workers=2), out, progress=False)
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == list(range(16))
    assert res["n"] == 16 and res["success_rate"] == 1.0 and res["success_ci95"][0] > 0.7
    assert (out / "report.html").read_text().count("<details>") == 16
    lines = (out / "episodes.jsonl").read_text()
    # a kill during a write leaves a partial line: resume ignores it and finishes the rest
    kept = "\n".join(lines.splitlines()[:10]) + '\n{"index": 3, "gro'
    (out / "episodes.jsonl").write_text(kept)
    res2 = evaluate(Evaluation("gaca/Diag-Corridor-v0", "expert", "all", {"split": "test"}),
                    out, progress=False)
    after = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(after) == 10 + 6 and res2["n"] == 16  # 6 played again, 10 skipped
    assert sorted(r["index"] for r in after) == list(range(16))
    with pytest.raises(ValueError, match="another evaluation"):
        evaluate(Evaluation("gaca/Diag-Corridor-v0", "random", "all", {"split": "test"}), out,
                 progress=False)


def test_gaca_eval_cli_on_alfworld_expert_and_random(tmp_path):
    data = alfworld_data_or_skip()
    for policy, expect in (("expert", 1.0), ("random", None)):
        out = tmp_path / policy
        cmd = [sys.executable, "-m", "gaca_agent.cli.eval", "--env", "gaca/ALFWorld-v0",
               "--env-kwargs", "split=valid_unseen", f"data_dir={data}", "--policy", policy,
               "--episodes", "3", "--workers", "2", "--out", str(out)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        res = json.loads((out / "results.json").read_text())
        assert res["n"] == 3 and res["failed"] == 0 and "per_task_type" in res
        # three episodes of 134 tasks: evenly spaced ids, so three task types, not one
        assert len(res["per_task_type"]) == 3
        if expect is not None:
            assert res["success_rate"] == expect
        else:
            assert res["mean_steps"] == 50  # random never finishes within the budget here


@pytest.mark.skipif(not has_module("bm25s"), reason="WebShop extras not installed")
def test_gaca_eval_on_webshop_expert_and_suite_compare(tmp_path):
    from gaca_agent.eval import suites

    res = evaluate(Evaluation("gaca/WebShop-v0", "expert", 5, {"split": "test"}),
                   tmp_path / "ws", progress=False)
    assert res["n"] == 5 and res["mean_score"] == 1.0
    rnd = evaluate(Evaluation("gaca/WebShop-v0", "random", 5, {"split": "test"}),
                   tmp_path / "wr", progress=False)
    assert rnd["n"] == 5 and rnd["mean_score"] < 1.0
    table = suites.run_suite("diag", "expert", tmp_path / "suite", progress=False)
    assert "| expert | diag v2 |" in table
    saved = json.loads((tmp_path / "suite" / "suite.json").read_text())
    assert list(saved["parts"]) == ["corridor", "signs", "slippery"]  # signs: the demo's
    text = suites.compare([tmp_path / "suite", tmp_path / "ws"])
    assert "diag v2" in text and "gaca/WebShop-v0" in text


def test_suite_episodes_override_and_per_part_rows(tmp_path):
    from gaca_agent.eval import suites

    table = suites.run_suite("diag", "expert", tmp_path / "s", progress=False, episodes="2")
    saved = json.loads((tmp_path / "s" / "suite.json").read_text())
    assert {r["n"] for r in saved["parts"].values()} == {2}  # --episodes replaced 'all'
    assert saved["version"] == "2-episodes-2" and "diag v2-episodes-2" in table
    row = {"n": 2, "failed": 0, "success_rate": 0.5, "success_ci95": [0.1, 0.9],
           "mean_score": 0.75, "mean_steps": 3.0}
    many = {"suite": "x", "version": "1", "policy": "p",
            "parts": {f"type{i}": dict(row, n=i + 1) for i in range(6)}}
    lines = suites.markdown([many]).splitlines()
    assert len(lines) == 2 + 6 + 1  # one row per part, then the total
    assert lines[2].startswith("| type0 | 0.500") and lines[-1].startswith("| all (p) |")
    assert "n=21" in lines[-1]


def test_plan_spreads_partial_evaluations_evenly():
    assert plan(3, 140, 0) == [(0, 0), (46, 1), (93, 2)]
    assert plan("all", 4, 10) == [(0, 10), (1, 11), (2, 12), (3, 13)]
    assert [t for t, _ in plan(6, 4, 0)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="positive"):
        plan(0, 4, 0)


def slow_random(delay: float = 0.4):
    """A random policy that takes ``delay`` seconds a turn (for the interrupt test)."""
    import time

    from gaca_agent.policies.scripted import RandomPolicy

    class Slow(RandomPolicy):
        def act(self, turns):
            time.sleep(delay)
            return super().act(turns)

    return Slow(seed=0)


def test_ctrl_c_saves_what_finished_and_resume_completes(tmp_path):
    """Episodes are written as they end; Ctrl-C exits cleanly (no traceback) with what
    finished saved, and the same command completes the evaluation."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "gaca_agent.cli.eval", "--env", "gaca/Diag-Slippery-v0",
           "--env-kwargs", "split=test", "--policy", "python:test_collector_eval:slow_random",
           "--policy-kwargs", "delay=0.05", "--episodes", "8", "--max-live-envs", "2",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    # a shell that starts the tests in the background hands on SIGINT ignored, and Python
    # then never raises KeyboardInterrupt: give the evaluation a terminal's default
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    episodes = out / "episodes.jsonl"
    import time

    deadline = time.time() + 120
    while time.time() < deadline and not (episodes.exists() and episodes.read_text().count("\n") >= 2):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err and "steps=" in err
    saved = [json.loads(x) for x in episodes.read_text().splitlines()]
    assert 2 <= len(saved) < 8
    partial = json.loads((out / "results.json").read_text())
    assert partial["complete"] is False and partial["n"] == len(saved)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    final = json.loads((out / "results.json").read_text())
    assert final["complete"] is True and final["n"] == 8


@pytest.mark.parametrize("spec", ["random", "hf"])
def test_resumed_evaluation_equals_a_fresh_one(tmp_path, spec, request):
    """Each episode's randomness comes from its own seed: playing 10 episodes at once, or
    4 and then resuming the other 6 in a different batch, gives the same episodes."""
    if spec == "hf":
        path = request.getfixturevalue("tiny_model_path")
        spec, kwargs = f"hf:{path}", {"max_new_tokens": 8}
    else:
        kwargs = {}
    fresh = tmp_path / "fresh"
    ev = Evaluation("gaca/Diag-Corridor-v0", spec, 10, {"split": "test"}, kwargs,
                    max_live_envs=10)
    evaluate(ev, fresh, progress=False)
    resumed = tmp_path / "resumed"
    evaluate(ev, resumed, progress=False)
    lines = (resumed / "episodes.jsonl").read_text().splitlines()
    (resumed / "episodes.jsonl").write_text("\n".join(lines[:4]) + "\n")
    evaluate(replace(ev, max_live_envs=3), resumed, progress=False)

    def responses(folder):
        records = [json.loads(x) for x in (folder / "episodes.jsonl").read_text().splitlines()]
        return {r["index"]: [s["response"] for s in r["trajectory"]] for r in records}

    a, b = responses(fresh), responses(resumed)
    assert sorted(a) == sorted(b) == list(range(10))
    assert a == b
    assert len({tuple(v) for v in a.values()}) > 1  # the episodes do differ from each other


def test_reports_show_raw_responses_validity_keys_and_nll(tmp_path):
    from gaca_agent.runs.report import render_report

    step = {"t": 0, "observation": "obs", "response": "I would <b>walk</b> on",
            "action": "", "format_valid": False, "action_valid": False, "reward": 0.0,
            "state_key": "abcdef0123456789", "nll": 1.234567}
    record = {"index": 0, "task_id": 0, "seed": 0, "won": False, "failed": False,
              "error": "", "score": 0.0, "steps": 1, "task": "t", "trajectory": [step]}
    page = render_report({"env": "e", "policy": "p"}, [record])
    assert "I would &lt;b&gt;walk&lt;/b&gt; on" in page  # the raw text, escaped
    assert "<code>abcdef01</code>" in page and "1.235" in page and ">format<" in page
    assert "advantage" not in page and "legend" in page
    train = render_report({}, [dict(record, trajectory=[dict(step, advantage=0.5,
                                                             weight=1.5)])], training=True)
    assert "<th>advantage</th>" in train and "+0.500" in train and "1.50" in train
