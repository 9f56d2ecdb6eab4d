"""An installed wheel works on its own: configs and templates are package data, and the
commands run from a folder outside the repository. The wheel is built from a clean copy
of the sources and installed into a fresh virtual environment (its dependencies come
from the test environment's site-packages, read-only; the source tree is not on its
path)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The ``bin/`` folder of a fresh venv with the gaca wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gaca_agent", "gaca_envs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(src), "-w", str(base / "dist")],
                   check=True, cwd=base)
    wheel = next((base / "dist").glob("gaca-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    # the test environment's packages (torch, transformers...), after the venv's own
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # without PYTHONPATH: a source tree on it (with its egg-info) would pass for gaca
    # already installed, and pip would skip the wheel
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--no-deps", str(wheel)], check=True, cwd=base,
                   env=clean_env())
    return venv / "bin"


def clean_env() -> dict[str, str]:
    """This process's environment without a source tree or venv on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = clean_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


def test_the_wheel_imports_from_its_own_install(installed, tmp_path):
    out = run(installed, "python", "-c", "import gaca_agent, gaca_envs; "
              "from gaca_agent.config import config_path; "
              "print(gaca_agent.__file__, config_path('default'))", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    module, config = out.stdout.split()
    assert "site-packages" in module and not module.startswith(str(ROOT))
    assert "site-packages" in config and config.endswith("configs/default.yaml")


def test_gaca_train_runs_the_shipped_default_config(installed, tmp_path):
    """``gaca-train --config default`` (one iteration here) from outside the repository:
    the config and the prompt templates come from the wheel."""
    out = run(installed, "gaca-train", "--config", "default", "--no-progress", "iterations=1",
              f"out_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = [json.loads(line) for line in
               (tmp_path / "runs" / "default" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [-1, 0]
    assert (tmp_path / "runs" / "default" / "final_eval" / "results.json").exists()
    listed = run(installed, "gaca-train", "--config", "nonesuch", cwd=tmp_path)
    assert listed.returncode == 2 and "paper/alfworld_qwen2_5_1_5b_gigpo" in listed.stderr


@pytest.mark.slow  # about 5 minutes on 2 cores: CI runs it
def test_reduced_study_runs_every_estimator_to_finite_metrics(installed, tmp_path):
    """``gaca-study --preset ci`` from the wheel: every estimator, 2 seeds, finite
    metrics, plots, per-step colours, and a rerun that resumes by skipping every run."""
    from gaca_agent.analysis.study import ESTIMATORS, PRESETS, plan

    runs = plan(PRESETS["ci"])
    assert {r.label for r in runs} == set(ESTIMATORS) and {r.seed for r in runs} == {0, 1}
    out = run(installed, "gaca-study", "--preset", "ci", "--out", str(tmp_path / "s"),
              "--jobs", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["failed"] == [] and summary["runs"] == len(runs)
    table = summary["results"]["signs"]
    assert set(table) == set(ESTIMATORS)
    for label, s in table.items():
        assert s["seeds"] == 2 and s["finite"], label
        assert {"-1", "0", "1"} <= set(s["curve"]), label  # warm-up + every iteration
        assert 0.0 <= s["final"]["mean"] <= 1.0 and math.isfinite(s["final"]["ci95"])
        assert "adv/weight_std" in s["diagnostics"]
    assert (tmp_path / "s" / "study_signs.png").stat().st_size > 10_000
    assert "| gaca | 2 |" in (tmp_path / "s" / "table.md").read_text()
    report = (tmp_path / "s" / "runs" / "signs__gaca__s0" / "train_report.html").read_text()
    assert "background:rgba(" in report  # per-step advantage / GACA weight colours
    again = run(installed, "gaca-study", "--preset", "ci", "--out", str(tmp_path / "s"),
                "--jobs", "2", cwd=tmp_path)
    assert again.returncode == 0  # a finished study resumes by skipping every run
