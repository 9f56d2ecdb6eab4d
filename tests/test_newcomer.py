"""A newcomer's first day: the everyday mistakes end in one-line errors (exit code 2,
nothing left on disk), slow servers keep what finished, policies share their names, and
your own env works in gaca-eval and gaca-train."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from gaca_agent.cli import eval as eval_cli
from gaca_agent.cli import train as train_cli
from gaca_envs.core import text_spaces
from gaca_envs.net import free_port

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- your own env
class CoinEnv(gym.Env):
    """A plain gymnasium env (no TextEnv, no num_tasks, no state keys): say the coin's
    side, shown in the first observation, to win."""

    def __init__(self, render_mode=None):
        self.observation_space, self.action_space = text_spaces()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side = ("heads", "tails")[int(self.np_random.integers(2))]
        return f"the coin shows {self.side}", {"admissible_actions": ["heads", "tails"]}

    def step(self, action):
        won = action == self.side
        return "done", float(won), True, False, {"won": won,
                                                 "admissible_actions": ["heads", "tails"]}


if "Coin-v0" not in gym.registry:
    gym.register("Coin-v0", entry_point=CoinEnv, max_episode_steps=3)
COIN = "test_newcomer:Coin-v0"


def run(main, argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, prog, *needles):
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------- 1. silent wrong data
def test_a_data_path_that_does_not_exist_is_an_error_naming_it(tmp_path, monkeypatch,
                                                                capsys, alfworld_dir):
    monkeypatch.chdir(tmp_path)
    nope = tmp_path / "nope"
    args = ["--env", "gaca/ALFWorld-v0", "--policy", "expert", "--episodes", "1"]
    rc, _, err = run(eval_cli.main, [*args, "--env-kwargs", f"data_dir={nope}"], capsys)
    one_line_error(rc, err, "gaca-eval", f"data_dir={nope}: no such file or folder")
    monkeypatch.setenv("ALFWORLD_DATA", str(nope))
    rc, _, err = run(eval_cli.main, args, capsys)
    one_line_error(rc, err, "gaca-eval", str(nope), "$ALFWORLD_DATA")
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("GACA_DATA", str(nope))
    rc, _, err = run(eval_cli.main, args, capsys)
    one_line_error(rc, err, "gaca-eval", f"$GACA_DATA={nope}: no such folder")
    monkeypatch.setenv("GACA_DATA", str(alfworld_dir.parent))
    rc, _, err = run(train_cli.main, ["--config", "default", "env.id=gaca/WebShop-v0",
                                      f"env.kwargs.catalog={nope}.json"], capsys)
    one_line_error(rc, err, "gaca-train", f"catalog={nope}.json: no such file or folder")
    assert not list(tmp_path.iterdir())  # no runs/ folder, nothing


# ------------------------------------------- 2. tracebacks for everyday mistakes
@pytest.mark.parametrize("argv, needles", [
    (["--env", "gaca/Diag-Sign-v0", "--policy", "random"],
     ["unknown env 'gaca/Diag-Sign-v0' (did you mean 'gaca/Diag-Signs-v0'?)"]),
    (["--env", "gaca/Diag-Signs-v0", "--env-kwargs", "wrld=signs", "--policy", "random"],
     ["takes no 'wrld' (did you mean 'world'?)"]),
    (["--env", "gaca/Diag-Signs-v0", "--env-kwargs", "split=tset", "--policy", "random"],
     ["split", "tset"]),
    (["--env", "gaca/Diag-Signs-v0", "--policy", "hf:./no/such/model"],
     ["model ./no/such/model: no such folder"]),
    (["--env", "gaca/Diag-Signs-v0", "--policy", "hf:someone/not-cached-model"],
     ["not in the Hugging Face cache"]),
    (["--env", "gaca/Diag-Signs-v0", "--policy", "openai:http://127.0.0.1:{port}/v1#m"],
     ["cannot reach http://127.0.0.1:{port}/v1"]),
    (["--env", "gaca/Diag-Signs-v0", "--policy", "random", "--env-servers",
      "http://127.0.0.1:{port}"], ["env server: cannot reach"]),
    (["--env", "nosuchmodule:Mine-v0", "--policy", "random"],
     ["cannot import module 'nosuchmodule'"]),
    (["--env", "gaca/Diag-Signs-v0", "--policy", "random", "--episodes", "0"],
     ["episodes must be a positive number"]),
])
def test_gaca_eval_mistakes_are_one_line_errors(argv, needles, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    for dry in ([], ["--dry-run"]):
        rc, _, err = run(eval_cli.main, argv + dry, capsys)
        one_line_error(rc, err, "gaca-eval", *[n.replace("{port}", str(port)) for n in needles])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, needle", [
    (["env.id=gaca/Diag-Sign-v0"], "did you mean 'gaca/Diag-Signs-v0'?"),
    (["env.eval_kwargs.wrld=3"], "takes no 'wrld'"),
    (["model.path=./no/such/model"], "model ./no/such/model: no such folder"),
    (["model.engine=server", "server.base_url=http://127.0.0.1:{port}/v1", "server.model=m",
      "learner.old_logprobs=recompute"], "server.base_url: cannot reach"),
    (["model.engine=fast"], "got 'fast'"),  # the value keeps both its quotes
])
def test_gaca_train_mistakes_are_one_line_errors_before_the_run_folder(
        overrides, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    port = str(free_port())
    overrides = [o.replace("{port}", port) for o in overrides]
    for dry in ([], ["--dry-run"]):
        rc, out, err = run(train_cli.main, ["--config", "default", *overrides, *dry], capsys)
        one_line_error(rc, err, "gaca-train", needle.replace("{port}", port))
    assert not list(tmp_path.iterdir())  # no run folder left behind


def test_gaca_serve_names_a_model_it_cannot_find(capsys):
    from gaca_agent.cli import serve as serve_cli

    rc, _, err = run(serve_cli.main, ["./no/such/model"], capsys)
    one_line_error(rc, err, "gaca-serve", "model ./no/such/model: no such folder")


def test_dry_runs_say_their_inputs_were_checked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run(train_cli.main, ["--config", "default", "--dry-run"], capsys)
    assert rc == 0 and "inputs checked" in out
    rc, out, _ = run(eval_cli.main, ["--env", "gaca/Diag-Signs-v0", "--env-kwargs",
                                     "split=test", "--policy", "random", "--episodes", "all",
                                     "--dry-run"], capsys)
    assert rc == 0 and "{'split': 'test'}: 16 tasks; 16 episodes" in out
    assert "inputs checked" in out
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------ 3. slow policies lose work
class SlowChat:
    """A chat-completions server that answers after ``delay_s``; after ``answers``
    answers it refuses with 500. Counts the requests it was sent."""

    def __init__(self, delay_s: float, answers: int = 10**6) -> None:
        self.delay_s, self.answers, self.requests, self.bodies = delay_s, answers, 0, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                outer.bodies.append(body)
                time.sleep(outer.delay_s)
                if outer.requests > outer.answers:
                    payload, code = {"error": {"message": "gone"}}, 500
                else:
                    payload, code = {"choices": [{"message": {
                        "content": "<think>x</think><action>walk forward</action>"}}]}, 200
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def turn(step=0):
    from gaca_agent.types import Turn

    return Turn("gaca/Diag-Corridor-v0", "reach the end", "you are in a corridor",
                ("walk forward", "rest"), step=step)


def test_a_request_the_server_took_is_never_sent_again(capsys):
    from gaca_agent.generate.http import ServerTimedOut
    from gaca_agent.policies import make_policy

    slow = SlowChat(delay_s=1.5)
    try:
        policy = make_policy(f"openai:{slow.base}#m", timeout_s=0.4, retries=3,
                             backoff_s=0.01, report_s=5)
        with pytest.raises(ServerTimedOut, match="not sent again"):
            policy.act([turn()])
        time.sleep(1.0)
        assert slow.requests == 1  # a timeout does not queue a second copy
        patient = make_policy(f"openai:{slow.base}#m", report_s=0.5, max_new_tokens=7)
        out = patient.act([turn(step=3)])
        assert out[0].action == "walk forward"
        assert slow.bodies[-1]["max_tokens"] == 7  # max_new_tokens, sent under the API's name
        err = capsys.readouterr().err
        assert "waiting on" in err and "step 3 of 'reach the end'" in err
    finally:
        slow.close()


def test_a_server_that_fails_midway_keeps_the_finished_episodes(tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    slow = SlowChat(delay_s=0.0, answers=4)  # two episodes of two steps, then 500s
    try:
        argv = ["--env", "gaca/Diag-Corridor-v0", "--env-kwargs", "max_episode_steps=2",
                "--policy", f"openai:{slow.base}#m", "--policy-kwargs", "retries=0",
                "--episodes", "4", "--max-live-envs", "1", "--out", "ev"]
        rc, _, err = run(eval_cli.main, argv, capsys)
    finally:
        slow.close()
    lines = [x for x in err.splitlines() if "error" in x]
    assert rc == 1 and len(lines) == 1 and "2 of 4 episodes saved in ev" in lines[0], err
    saved = (tmp_path / "ev" / "episodes.jsonl").read_text().splitlines()
    assert len(saved) == 2 and not json.loads((tmp_path / "ev" / "results.json").read_text())[
        "complete"]


# -------------------------------------------------- 4. names differ between policies
def test_every_model_policy_takes_the_same_generation_names():
    from gaca_agent.config.checks import check_kwargs
    from gaca_agent.policies import policy_factory
    from gaca_agent.policies.served import ServerPolicy

    names = {"temperature": 0.5, "max_new_tokens": 8}
    for spec in ("hf:x", "smollm2", "openai:http://h/v1#m"):
        factory, _ = policy_factory(spec)
        check_kwargs(factory, names, spec)
    check_kwargs(ServerPolicy, names, "server")
    from gaca_agent.config.checks import InputError

    with pytest.raises(InputError, match="takes no 'max_tokens' \\(did you mean "
                                         "'max_new_tokens'\\?\\)"):
        check_kwargs(policy_factory("openai:http://h/v1#m")[0], {"max_tokens": 8}, "openai")


def test_expert_on_an_env_without_one_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(eval_cli.main, ["--env", COIN, "--policy", "expert"], capsys)
    one_line_error(rc, err, "gaca-eval", f"env {COIN} has no expert")


def test_evaluation_samples_at_one_stated_temperature(tmp_path, monkeypatch):
    from gaca_agent import policies
    from gaca_agent.config import ModelSection
    from gaca_agent.eval.evaluate import Evaluation, eval_policy_kwargs, evaluate

    assert ModelSection().eval_temperature == policies.EVAL_TEMPERATURE == 0.4
    assert eval_policy_kwargs("hf:m", {}) == {"temperature": 0.4}
    assert eval_policy_kwargs("openai:u#m", {"temperature": 0.9}) == {"temperature": 0.9}
    assert eval_policy_kwargs("random", {}) == {}
    seen, real = {}, policies.make_policy

    def fake(spec, **kwargs):
        seen.update(kwargs)
        return real("random")

    monkeypatch.setattr(policies, "make_policy", fake)
    evaluate(Evaluation("gaca/Diag-Corridor-v0", "smollm2", 1), tmp_path / "e", progress=False)
    assert seen == {"temperature": 0.4}


# ------------------------------------------------------------- 5. quiet runs
def test_iteration_lines_and_quiet_libraries():
    from transformers.utils import logging as hf_logging

    from gaca_agent.runs.progress import iteration_line, quiet_libraries

    line = iteration_line("run", 2, 8, {"rollout/success": 0.25, "eval/success": 0.5,
                                        "losses/policy": -0.0123, "losses/kl": 4e-4,
                                        "adv/zero_variance_groups": 0.75}, 12.34)
    assert line == ("run iteration 3/8: rollout success 0.250, eval success 0.500, "
                    "groups alike 75%, policy loss -0.0123, kl 0.0004, 12.3 s")
    # every group alike (a near-greedy sampler, tasks all won or all lost): said plainly
    flat = iteration_line("run", 0, 8, {"rollout/success": 0.75,
                                        "adv/zero_variance_groups": 1.0}, 1.0)
    assert flat.splitlines()[0].endswith("groups alike 100%, 1.0 s")
    assert "no episode-level advantage this iteration" in flat.splitlines()[1]
    assert "no update" not in flat  # the update still ran (step-level terms, the KL)
    skipped = iteration_line("run", 0, 8, {"adv/zero_variance_groups": 1.0,
                                           "train/filtered_rows_frac": 1.0}, 1.0)
    assert "algo.filter_groups left every row out: no update" in skipped
    assert "\n" not in iteration_line("run", 0, 8, {"adv/zero_variance_groups": 0.875}, 1.0)
    hf_logging.enable_progress_bar()
    quiet_libraries()
    assert not hf_logging.is_progress_bar_enabled()


def test_the_warm_up_says_how_far_it_is_without_a_bar(capsys):
    """A long warm-up (an LM's: minutes) prints a line at every tenth of its steps and a
    last line with what it reached, when there is no bar."""
    from gaca_agent.runs.progress import warmup_line, warmup_progress

    with warmup_progress("lm", 20, bar=False) as on_step:
        for step in range(1, 21):
            on_step(step, 2.0 / step)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"lm warm-up step {k}/20" for k in range(2, 21, 2)]
    assert lines[-1].startswith("lm warm-up step 20/20: loss 0.100, ")
    assert warmup_line("lm", {"warmup/first_loss": 1.69, "warmup/last_loss": 0.2,
                              "eval/success": 0.125, "eval_before/success": 0.0}) == \
        "lm warm-up: loss 1.690 -> 0.200, eval success 0.125 (zero-shot 0.000)"


def test_gaca_eval_without_a_bar_keeps_its_log_to_the_results(tmp_path, monkeypatch,
                                                              capsys):
    """``gaca-eval --no-progress`` (gaca-train's flag) draws no bar on stderr, which a
    long evaluation's log file would otherwise fill; without it the bar counts episodes."""
    monkeypatch.chdir(tmp_path)
    argv = ["--env", "gaca/Diag-Signs-v0", "--policy", "random", "--episodes", "2"]
    for flag, bar in (["--no-progress"], False), ([], True):
        rc, out, err = run(eval_cli.main, argv + flag + ["--out", f"e{len(flag)}"], capsys)
        assert rc == 0 and '"success_rate"' in out
        assert ("2/2" in err) is bar, err


# ---------------------------------------------------------- 6. your own env
def test_a_plain_gymnasium_env_plays_in_gaca_eval(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(eval_cli.main, ["--env", COIN, "--policy", "random", "--episodes",
                                       "6", "--out", "coin"], capsys)
    assert rc == 0, err
    records = [json.loads(x) for x in (tmp_path / "coin/episodes.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["seed"] for r in records} == set(range(6))
    keys = {r["trajectory"][0]["state_key"] for r in records}
    assert len(keys) == 2 and "" not in keys  # its observations stand in for states
    rc, _, err = run(eval_cli.main, ["--env", COIN, "--policy", "random", "--episodes", "all"],
                     capsys)
    one_line_error(rc, err, "gaca-eval", "no num_tasks")


def test_a_plain_gymnasium_env_trains_in_gaca_train(tmp_path):
    run_ = subprocess.run(
        [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config", "default",
         f"env.id={COIN}", "env.kwargs={}", "env.eval_kwargs={}", "env.eval_episodes=4",
         "iterations=1", "env.groups=2", "env.group_size=2", "warmup.bc_steps=0",
         "model.max_new_tokens=8", f"out_dir={tmp_path}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert run_.returncode == 0, run_.stderr[-3000:]
    assert "default iteration 1/1" in run_.stdout
    assert (tmp_path / "default" / "final_eval" / "results.json").exists()


# ------------------------------------------------------------ 7. ScienceWorld
def test_scienceworld_jvm_heap_and_envs_per_jvm_are_kwargs_with_defaults():
    pytest.importorskip("scienceworld")
    import shutil

    if shutil.which("java") is None:
        pytest.skip("no Java runtime")
    from gaca_envs.scienceworld.jvm import ENVS_PER_JVM, auto_heap, check_heap

    assert ENVS_PER_JVM == 16 and auto_heap(16) == "1216m"
    with pytest.raises(ValueError, match="jvm_heap must be a size"):
        check_heap("lots")
    with pytest.raises(ValueError, match="envs_per_jvm must be an integer >= 1"):
        gym.make("gaca/ScienceWorld-v0", split="test", task_types="boil", envs_per_jvm=0)
    envs = [gym.make("gaca/ScienceWorld-v0", split="test", task_types="boil",
                     jvm_heap=heap, envs_per_jvm=1) for heap in ("512m", "auto")]
    try:
        for env, xmx in zip(envs, ("-Xmx512m", "-Xmx256m")):  # auto: 192 + 64 per env
            pid = env.unwrapped._engine.pid
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert xmx.encode() in args and b"-XX:hashCode=2" in args
            env.reset(options={"task_id": 0})
    finally:
        for env in envs:
            env.close()


# ----------------------------------------------------------- 8. stale examples
def test_gaca_env_serve_on_a_busy_port_fails_before_its_banner():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gaca_envs.remote.service",
                               "gaca/Diag-Corridor-v0", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot listen on 127.0.0.1" in done.stderr
    assert "on http://" not in done.stderr


def test_step_before_reset_speaks_of_the_session():
    pytest.importorskip("openenv")
    from gaca_envs.remote.service import ServeSettings, make_environment_class

    env_class, action_class, *_ = make_environment_class(
        ServeSettings("gaca/Diag-Corridor-v0", {}, ()))
    with pytest.raises(RuntimeError) as err:
        env_class().step(action_class(action="rest"))
    assert "no episode has started in this session" in str(err.value)
    assert "HTTP" not in str(err.value)


def test_audit_and_rescore_refuse_episodes_without_task_groups(tmp_path, capsys):
    from gaca_agent.cli import audit as audit_cli
    from gaca_agent.cli import rescore as rescore_cli
    from gaca_agent.eval.evaluate import Evaluation, evaluate

    evaluate(Evaluation("gaca/Diag-Corridor-v0", "random", 3), tmp_path / "lone",
             progress=False)
    for main, prog in ((audit_cli.main, "gaca-audit"), (rescore_cli.main, "gaca-rescore")):
        rc, _, err = run(main, [str(tmp_path / "lone")], capsys)
        one_line_error(rc, err, prog, "holds one rollout", "--group-size")
    evaluate(Evaluation("gaca/Diag-Corridor-v0", "random", 2, group_size=3),
             tmp_path / "groups", progress=False)
    assert audit_cli.main([str(tmp_path / "groups")]) == 0
    assert rescore_cli.main([str(tmp_path / "groups")]) == 0


def test_the_readme_training_override_runs():
    """The README's `algo.estimator=gigpo` on the default (GACA) config: GACA's own
    parameters are dropped with a note, the shared ones kept."""
    from gaca_agent.config import load_config

    cfg = load_config("default", ["algo.estimator=gigpo", "learner.lr=3e-4"])
    assert cfg.algo.estimator == "gigpo" and set(cfg.algo.params) == {"gamma", "omega"}
    assert cfg.learner.lr == pytest.approx(3e-4)
    np.testing.assert_equal(cfg.algo.params["gamma"], 0.95)
    # parameters the command line gives are the user's: never dropped, still checked
    for given in (["algo.params={kappa: 1.0}"], ["algo.params.kappa=1.0"]):
        with pytest.raises((TypeError, ValueError), match="kappa"):
            load_config("default", ["algo.estimator=gigpo", *given])
