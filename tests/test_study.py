"""The comparison study, reduced (2 seeds, 2 iterations): structure and finite metrics."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")


def test_reduced_study_runs_every_estimator_to_finite_metrics(tmp_path):
    from gaca_agent.analysis.study import ESTIMATORS, PRESETS, plan
    from gaca_agent.cli.study import main

    runs = plan(PRESETS["ci"])
    assert {r.label for r in runs} == set(ESTIMATORS) and {r.seed for r in runs} == {0, 1}
    assert main(["--preset", "ci", "--out", str(tmp_path), "--jobs", "2"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == [] and summary["runs"] == len(runs)
    table = summary["results"]["signs"]
    assert set(table) == set(ESTIMATORS)
    for label, s in table.items():
        assert s["seeds"] == 2 and s["finite"], label
        assert {"-1", "0", "1"} <= set(s["curve"]), label  # warm-up + every iteration
        assert 0.0 <= s["final"]["mean"] <= 1.0 and math.isfinite(s["final"]["ci95"])
        assert "adv/weight_std" in s["diagnostics"]
    assert (tmp_path / "study_signs.png").stat().st_size > 10_000
    assert "| gaca | 2 |" in (tmp_path / "table.md").read_text()
    report = (tmp_path / "runs" / "signs__gaca__s0" / "train_report.html").read_text()
    assert "background:rgba(" in report  # per-step advantage / GACA weight colours
    again = main(["--preset", "ci", "--out", str(tmp_path), "--jobs", "2"])
    assert again == 0  # a finished study resumes by skipping every run
