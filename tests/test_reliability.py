"""Short versions of the reliability benchmarks: the env-server and gaca-serve soaks with
misbehaving clients, and gaca-eval with workers killed under it and a Ctrl-C. The long
runs and their figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import has_module

ROOT = Path(__file__).resolve().parents[1]


def bench(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not (has_module("openenv") and has_module("uvicorn")),
                    reason="env server needs the envserver extra (pip install -e '.[envserver]')")
def test_env_server_soak_with_dropped_connections_and_malformed_frames(tmp_path):
    out = tmp_path / "soak.json"
    run = bench("soak_env_server.py", "--env", "diag", "--minutes", "0.25", "--clients", "12",
                "--chaos", "0.3", "--idle-timeout", "5", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["steps"] > 1000 and r["dropped_connections"] > 0 and r["malformed_frames"] > 0
    assert r["idle_sessions_left_open"] > 0
    assert r["client_errors"] == 0, r["first_client_errors"]
    assert r["server_error_lines"] == 0, r["first_server_errors"]
    assert r["sessions_after_idle_timeout"] == 0


def test_gaca_serve_soak_answers_every_request(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "soak.json"
    run = bench("soak_gaca_serve.py", "--minutes", "0.25", "--clients", "12",
                "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    kinds = r["by_kind_and_status"]
    assert set(kinds) == {"chat", "n>1", "stream", "cancelled stream", "oversized",
                          "not json"}, kinds
    assert kinds["oversized"] == {"413": kinds["oversized"]["413"]}
    assert r["unanswered"] == 0 and r["5xx"] == 0 and r["problems"] == 0, r["first_problems"]
    assert r["after_soak_16_at_once"]["statuses"] == [200] * 16
    assert r["server_error_lines"] == 0, r["first_server_errors"]


def test_eval_with_killed_workers_and_a_ctrl_c_equals_an_undisturbed_one(tmp_path):
    out = tmp_path / "report.json"
    run = bench("chaos_eval.py", "--episodes", "300", "--kill-every", "50",
                "--out", str(tmp_path / "runs"), "--json", str(out))
    r = json.loads(out.read_text())
    assert run.returncode == 0, (r, run.stderr[-2000:])
    assert r["kills"] >= 2 and r["ctrl_c_exit_code"] == 130
    assert r["failed_records_written_then_replayed"] > 0  # the kills did hit episodes
    assert 0 < r["finished_before_resume"] < 300 and r["resume_exit_code"] == 0
    assert r["indices_in_results"] and r["results_n"] == 300 and r["failed_in_results"] == 0
    assert r["episodes_differing_from_undisturbed"] == 0, r["first_differing"]


@pytest.mark.slow
def test_scienceworld_eval_with_killed_jvms_equals_an_undisturbed_one(tmp_path):
    """Engines share JVMs: a killed JVM fails the episodes of its engines, which are played
    again on a new one; a new engine plays a short episode as the undisturbed run's engine
    did (a constant identity hash), so every episode equals the undisturbed run's."""
    import shutil

    if not has_module("scienceworld") or shutil.which("java") is None:
        pytest.skip("needs the scienceworld extra and a Java runtime")
    out = tmp_path / "report.json"
    run = bench("chaos_eval.py", "--env", "scienceworld", "--episodes", "12",
                "--kill-every", "4", "--max-live-envs", "6", "--out", str(tmp_path / "runs"),
                "--json", str(out), timeout=1200)
    r = json.loads(out.read_text())
    assert run.returncode == 0, (r, run.stderr[-2000:])
    assert r["killed"] == "jvm" and r["kills"] >= 2
    assert r["failed_records_written_then_replayed"] > 0
    assert r["indices_in_results"] and r["results_n"] == 12 and r["failed_in_results"] == 0
    assert r["episodes_differing_from_undisturbed"] == 0, r["first_differing"]


def test_resume_flag_continues_with_the_saved_settings(tmp_path):
    from gaca_agent.cli.eval import main, parser, resumed

    out = tmp_path / "eval"
    assert main(["--env", "gaca/Diag-Corridor-v0", "--env-kwargs", "split=test",
                 "--policy", "random", "--episodes", "6", "--seed", "3", "--out",
                 str(out)]) == 0
    full = (out / "episodes.jsonl").read_text().splitlines()
    (out / "episodes.jsonl").write_text("\n".join(full[:3]) + "\n")  # as if stopped there
    assert main(["--resume", str(out)]) == 0
    records = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(6))
    assert [json.loads(x)["seed"] for x in full] == [r["seed"] for r in records]
    assert main(["--resume", str(out), "--policy", "expert"]) == 2  # settings are the run's
    assert main(["--resume", str(tmp_path / "nothing")]) == 2
    # the policy's kwargs (a model's temperature) are saved and come back
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "policy_kwargs":
                                                 {"temperature": 0.7}}))
    args = parser().parse_args(["--resume", str(out)])
    resumed(args)
    assert args.policy_kwargs == ["temperature=0.7"] and args.seed == 3
    assert args.env_kwargs == ['split="test"'] and args.out == out
