"""``gaca-eval --leaderboard``: gaca-eval folders and a gaca-train run's three stages in
one table per protocol, with Wilson intervals; rows of another protocol apart."""

from __future__ import annotations

import json

import pytest
import yaml


def fake_run(root, name="lm_signs", final=True):
    """A gaca-train run folder as the trainer leaves it: its config, a warm-up row with
    the zero-shot and after-warm-up evaluations, two evaluations after, a final_eval."""
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "name": name, "env": {"id": "gaca/Diag-Signs-v0", "kwargs": {"split": "train"},
                              "eval_kwargs": {"split": "test"}, "eval_episodes": 8},
        "model": {"path": "smollm2", "eval_temperature": 0.4},
        "warmup": {"bc_steps": 10}}))
    rows = [{"iteration": -1, "eval_before/success": 0.0, "eval_before/score": 0.0,
             "eval_before/format_invalid": 1.0, "eval/success": 0.25, "eval/score": 0.25,
             "eval/format_invalid": 0.5},
            {"iteration": 0, "rollout/success": 0.3},
            {"iteration": 1, "eval/success": 0.5, "eval/score": 0.5,
             "eval/format_invalid": 0.1}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if final:
        (run / "final_eval").mkdir()
        (run / "final_eval" / "config.json").write_text(json.dumps({
            "env": "gaca/Diag-Signs-v0", "env_kwargs": {"split": "test"}, "policy": "trained",
            "episodes": "8", "seed": 10000}))
        (run / "final_eval" / "results.json").write_text(json.dumps({
            "n": 8, "success_rate": 0.625, "mean_score": 0.625, "format_invalid_rate": 0.05}))
    return run


def test_a_leaderboard_rows_every_policy_on_the_same_tasks(tmp_path):
    from gaca_agent.cli.eval import main
    from gaca_agent.eval.leaderboard import collect
    from gaca_agent.runs.results import wilson

    boards = tmp_path / "runs" / "leaderboard"
    for policy in ("random", "expert"):  # the training run's protocol: seed 10000, 8 episodes
        assert main(["--env", "gaca/Diag-Signs-v0", "--env-kwargs", "split=test",
                     "--policy", policy, "--episodes", "8", "--seed", "10000", "--workers",
                     "0", "--out", str(boards / "signs" / policy)]) == 0
    assert main(["--env", "gaca/Diag-Signs-v0", "--env-kwargs", "split=test", "--policy",
                 "random", "--episodes", "8", "--workers", "0", "--out",
                 str(boards / "other-seed")]) == 0  # seed 0: other tasks, another table
    run = fake_run(tmp_path / "runs")
    out = tmp_path / "docs" / "leaderboard.md"
    assert main(["--leaderboard", str(boards), str(run), "--out", str(out)]) == 0
    text = out.read_text()
    tables = text.split("\n## ")[1:]
    assert len(tables) == 2
    # the same env and kwargs on other tasks: two headings a reader (and a link) can tell apart
    assert sorted(t.splitlines()[0] for t in tables) == [
        "gaca/Diag-Signs-v0 (split=test): 8 episodes from seed 0",
        "gaca/Diag-Signs-v0 (split=test): 8 episodes from seed 10000"]
    same = next(t for t in tables if "seed 10000" in t)
    lines = [line.split(" | ") for line in same.splitlines()
             if line.startswith("| ") and "---" not in line][1:]
    names = [cells[0].lstrip("| ") for cells in lines]
    wins = [int(cells[1].split(" / ")[0]) for cells in lines]
    # one table: the expert, random and the run's three stages (after RL: final_eval's
    # 5 / 8, not its last evaluation's 4 / 8), best first
    assert sorted(names) == sorted(["expert", "random", "smollm2 zero-shot (lm_signs)",
                                    "smollm2 after warm-up (lm_signs)",
                                    "smollm2 after RL (lm_signs)"])
    assert names[0] == "expert" and wins == sorted(wins, reverse=True)
    low, high = wilson(5, 8)
    assert f"| 5 / 8 ({low:.2f}-{high:.2f}) | 0.625 | 5% | 0.4 |" in same
    assert f"| 0 / 8 (0.00-{wilson(0, 8)[1]:.2f}) | 0.000 | 100% | 0.4 |" in same
    assert "random" in next(t for t in tables if "seed 0 " in t)
    rows = {r.policy: r for r in collect([run])}
    assert rows["smollm2 after warm-up (lm_signs)"].successes == 2


def test_without_a_final_evaluation_the_last_evaluation_is_the_after_rl_row(tmp_path):
    from gaca_agent.eval.leaderboard import collect

    rows = {r.policy: r for r in collect([fake_run(tmp_path, final=False)])}
    assert rows["smollm2 after RL (lm_signs)"].successes == 4  # 0.5 of 8, iteration 1
    assert len(rows) == 3


def test_a_path_with_no_evaluation_is_one_clear_error(tmp_path, capsys):
    from gaca_agent.cli.eval import main

    (tmp_path / "empty").mkdir()
    assert main(["--leaderboard", str(tmp_path / "empty")]) != 0
    assert "holds no gaca-eval results" in capsys.readouterr().err


def test_two_evaluations_of_the_same_episodes_are_compared_pair_by_pair(tmp_path, capsys):
    """gaca-eval --compare A B on the same plan adds the paired line: wins of each, the
    episodes only one won, and the exact sign test over those; another plan gets none."""
    from gaca_agent.analysis.paired import paired
    from gaca_agent.cli.eval import main

    # the pure count against a plain computation: 6 episodes only B won, none only A
    a = {i: i < 2 for i in range(10)}
    b = {i: i < 8 for i in range(10)}
    assert paired(a, b) == {"n": 10, "won_a": 2, "won_b": 8, "only_a": 0, "only_b": 6,
                            "p": pytest.approx(2 / 2 ** 6)}
    assert paired({0: True, 1: False}, {1: True, 2: True})["n"] == 1  # both played: 1
    common = ["--env", "gaca/Diag-Corridor-v0", "--env-kwargs", "split=test", "--episodes",
              "12", "--workers", "0"]
    for policy in ("random", "expert"):
        assert main([*common, "--policy", policy, "--out", str(tmp_path / policy)]) == 0
    assert main([*common[:5], "6", *common[6:], "--policy", "expert", "--out",
                 str(tmp_path / "fewer")]) == 0
    capsys.readouterr()
    assert main(["--compare", str(tmp_path / "random"), str(tmp_path / "expert")]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    won = {p: json.loads((tmp_path / p / "results.json").read_text())["success_rate"] * 12
           for p in ("random", "expert")}
    assert line.startswith("paired over the 12 episodes both played")
    assert f"expert won {won['expert']:.0f}" in line and f"random won {won['random']:.0f}" in line
    assert won["expert"] == 12 and "p = " in line
    assert main(["--compare", str(tmp_path / "random"), str(tmp_path / "fewer")]) == 0
    assert "paired" not in capsys.readouterr().out  # 6 planned episodes: another plan


def test_a_run_from_another_runs_warm_up_rows_its_own_evaluation_folders(tmp_path):
    """A run started from another's ``warmup/`` (``warmup.bc_steps: 0``) rows its start as
    "before RL" from its ``warmup_eval/`` folder (its ``eval_before``, the same model, is
    not rowed again as zero-shot), and names the model by its folder's last two parts,
    not the machine's absolute path."""
    from gaca_agent.eval.leaderboard import collect

    run = fake_run(tmp_path, name="from_warm")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["path"] = str(tmp_path / "runs" / "first" / "warmup")
    cfg["warmup"]["bc_steps"] = 0
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    start = run / "warmup_eval"
    start.mkdir()
    (start / "config.json").write_text((run / "final_eval" / "config.json").read_text())
    (start / "results.json").write_text(json.dumps(
        {"n": 8, "success_rate": 0.375, "mean_score": 0.375, "format_invalid_rate": 0.0}))
    rows = {r.policy: r for r in collect([run])}
    assert set(rows) == {"first/warmup before RL (from_warm)",
                         "first/warmup after RL (from_warm)"}
    before = rows["first/warmup before RL (from_warm)"]
    assert (before.successes, before.temperature, before.source) == (3, 0.4, str(start))
