"""The collector (worker processes, failures) and gaca-eval (results, resume, suites)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gaca_agent.collector import Collector, CollectorConfig, to_step_batch
from gaca_agent.evaluate import evaluate
from gaca_agent.policies import make_policy
from gaca_agent.prompts import PromptBuilder, parse_response
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
    assert "put a mug in the sink" in text and "'take mug 1', 'look'" in text
    assert "Action 2: 'go to desk 1'" in text and "Action 1" not in text
    assert "<action> </action>" in text


def test_groups_share_start_and_rows_cover_every_step():
    collector = Collector(CollectorConfig("gaca/Diag-Slippery-v0", {"split": "test"},
                                          num_workers=2, max_live_envs=6))
    try:
        episodes = collector.run(make_policy("random", seed=1), [(0, 5), (3, 9)], group_size=4)
    finally:
        collector.close()
    assert [(e.group, e.traj) for e in episodes] == [(g, g * 4 + i) for g in range(2)
                                                   for i in range(4)]
    for g in range(2):
        starts = {e.steps[0].state_key for e in episodes if e.group == g}
        assert len(starts) == 1  # a group starts from one state
    batch, index = to_step_batch(episodes)
    assert len(index) == sum(e.length for e in episodes)
    assert set(batch.traj.tolist()) == set(range(8))
    assert all(not e.failed and (e.steps[-1].terminated or e.steps[-1].truncated)
               for e in episodes)


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
    collector = Collector(CollectorConfig("gaca/Diag-Corridor-v0", {"split": "test"},
                                          num_workers=2, max_live_envs=4, timeout_s=30))
    try:
        episodes = collector.run(KillOnce(collector), [(k, k) for k in range(6)], 1)
        restarts = collector.pool.restarts
        again = collector.run(make_policy("expert"), [(0, 0)], 1)
    finally:
        collector.close()
    assert len(episodes) == 6 and restarts >= 1
    failed = [e for e in episodes if e.failed]
    assert failed and all("died" in e.error for e in failed)
    assert all(e.won for e in episodes if not e.failed)
    assert again[0].won  # the restarted worker serves new episodes


def test_eval_all_covers_each_task_once_and_resumes(tmp_path):
    out = tmp_path / "eval"
    res = evaluate("gaca/Diag-Corridor-v0", {"split": "test"}, "expert", "all", out,
                   workers=2, progress=False)
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == list(range(16))
    assert res["n"] == 16 and res["success_rate"] == 1.0 and res["success_ci95"][0] > 0.7
    assert (out / "report.html").read_text().count("<details>") == 16
    lines = (out / "episodes.jsonl").read_text()
    # a kill during a write leaves a partial line: resume ignores it and finishes the rest
    kept = "\n".join(lines.splitlines()[:10]) + '\n{"index": 3, "gro'
    (out / "episodes.jsonl").write_text(kept)
    res2 = evaluate("gaca/Diag-Corridor-v0", {"split": "test"}, "expert", "all", out,
                    progress=False)
    after = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(after) == 10 + 6 and res2["n"] == 16  # 6 played again, 10 skipped
    assert sorted(r["index"] for r in after) == list(range(16))
    with pytest.raises(SystemExit, match="another evaluation"):
        evaluate("gaca/Diag-Corridor-v0", {"split": "test"}, "random", "all", out,
                 progress=False)


def test_gaca_eval_cli_on_alfworld_expert_and_random(tmp_path):
    data = alfworld_data_or_skip()
    for policy, expect in (("expert", 1.0), ("random", None)):
        out = tmp_path / policy
        cmd = [sys.executable, "-m", "gaca_agent.evaluate", "--env", "gaca/ALFWorld-v0",
               "--env-kwargs", "split=valid_unseen", f"data_dir={data}", "--policy", policy,
               "--episodes", "3", "--workers", "2", "--out", str(out)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        res = json.loads((out / "results.json").read_text())
        assert res["n"] == 3 and res["failed"] == 0 and "per_task_type" in res
        if expect is not None:
            assert res["success_rate"] == expect
        else:
            assert res["mean_steps"] == 50  # random never finishes within the budget here


@pytest.mark.skipif(not has_module("bm25s"), reason="WebShop extras not installed")
def test_gaca_eval_on_webshop_expert_and_suite_compare(tmp_path):
    from gaca_agent import suites

    res = evaluate("gaca/WebShop-v0", {"split": "test"}, "expert", 5, tmp_path / "ws",
                   progress=False)
    assert res["n"] == 5 and res["mean_score"] == 1.0
    rnd = evaluate("gaca/WebShop-v0", {"split": "test"}, "random", 5, tmp_path / "wr",
                   progress=False)
    assert rnd["n"] == 5 and rnd["mean_score"] < 1.0
    table = suites.run_suite("diag", "expert", tmp_path / "suite", progress=False)
    assert "| expert | diag v1 |" in table
    text = suites.compare([tmp_path / "suite", tmp_path / "ws"])
    assert "diag v1" in text and "gaca/WebShop-v0" in text
