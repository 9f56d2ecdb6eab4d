"""Shared fixtures: data discovery, one env instance per kind, a tiny TextWorld game."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the tests read the real data sets from the shared folder beside the repository
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if _SHARED_DATA.is_dir():
    os.environ.setdefault("GACA_DATA", str(_SHARED_DATA))

import pytest  # noqa: E402

from gaca_envs.data import data_path  # noqa: E402
from gaca_envs.net import free_port  # noqa: E402,F401 - for the tests

try:  # keep torch single-threaded: a busy neighbour makes two threads 3-10x slower
    import torch

    torch.set_num_threads(1)
except ImportError:
    pass


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def alfworld_data_or_skip():
    if not (has_module("alfworld") and has_module("textworld")):
        pytest.skip("alfworld/textworld not installed (pip install -e '.[alfworld]')")
    path = data_path("alfworld")
    if path is None:
        pytest.skip("ALFWorld data not found: set GACA_DATA to a folder holding alfworld/ "
                    "(the tests default it to ../shared/data beside the repository)")
    return path


@pytest.fixture(scope="session")
def alfworld_dir():
    return alfworld_data_or_skip()


@pytest.fixture(scope="session")
def valid_seen(alfworld_dir):
    """One ALFWorld valid_seen env shared by the tests (resets reuse cached games)."""
    import gymnasium as gym

    env = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
    yield env
    env.close()


@pytest.fixture(scope="session")
def tiny_textworld_game(tmp_path_factory):
    """A small TextWorld game made offline with TextWorld's own generator."""
    if not has_module("textworld"):
        pytest.skip("textworld not installed (pip install -e '.[alfworld]')")
    import textworld
    import textworld.generator as generator

    options = textworld.GameOptions()
    options.seeds = 1234
    options.nb_rooms, options.nb_objects, options.quest_length = 2, 4, 3
    options.path = str(tmp_path_factory.mktemp("tw") / "tiny.z8")
    options.force_recompile = True
    return generator.compile_game(generator.make_game(options), options)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """The tiny random Llama model with its in-process-trained tokenizer."""
    if not (has_module("torch") and has_module("transformers")):
        pytest.skip("torch/transformers not installed (pip install -e '.[train]')")
    from gaca_agent.policies.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture
def fresh_accelerate():
    """accelerate's state is process-wide: a test that builds another library's trainer
    (TRL's set bf16) or runs gaca-train must not leave it to the learner tests on the same
    worker; reset before the test (whatever ran earlier) and after it."""
    from accelerate.state import AcceleratorState, GradientState

    def reset():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    reset()
    yield
    reset()


def full_logprobs(model, prompt_ids, completion_ids, temperature=1.0):
    """Reference log-probs: log-softmax over the whole vocabulary in one teacher-forced
    pass, float64 (the plain computation the memory-bounded paths must equal)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].double()
    t = temperature if temperature > 0 else 1.0
    target = torch.tensor(list(completion_ids), device=model.device)[:, None]
    return (logits / t).log_softmax(-1).gather(-1, target).squeeze(-1).cpu()


def start_env_server(env_id: str, *args: str, timeout_s: float = 120.0):
    """A ``gaca-env-serve`` process on a free loopback port: ``(process, url)``."""
    if not (has_module("openenv") and has_module("uvicorn") and has_module("websockets")):
        pytest.skip("env server needs the envserver extra (pip install -e '.[envserver]')")
    from gaca_envs.remote.launch import start_process

    return start_process(env_id, *args, timeout_s=timeout_s)


def stop_env_server(proc) -> None:
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def diag_server():
    """A gaca-env-serve of gaca/Diag-Signs-v0 shared by the tests: its URL."""
    proc, url = start_env_server("gaca/Diag-Signs-v0")
    yield url
    stop_env_server(proc)


def stop_at_first_checkpoint(run, run_dir, victim, iterations: int):
    """Wait for the gaca-train process ``run`` to write its first checkpoint, SIGKILL the
    ``victim`` server, and wait for the run to stop: it must exit 1 with one error line
    and no traceback. Returns (the iteration that stopped, that line)."""
    import re
    import signal
    import time

    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and run.poll() is None and not latest.exists():
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stderr = run.communicate(timeout=600)[1]
    assert run.returncode == 1, stderr[-3000:]
    errors = [x for x in stderr.splitlines() if x.startswith("gaca-train: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    # the kill lands in iteration 2's collection, or (on a busy machine) during its
    # update, and then iteration 3 is the one that finds the server gone
    stopped = int(re.search(rf"iteration (\d+)/{iterations} stopped", errors[0]).group(1))
    assert stopped in (2, 3), errors
    assert f"iter-{stopped - 2:05d}, is intact" in errors[0], errors
    return stopped, errors[0]


def picks_of(monkeypatch) -> list:
    """The server index a ServerGroup picks for each turn, in order (recorded)."""
    from gaca_agent.generate.server_group import ServerGroup

    picked: list = []
    pick = ServerGroup._pick
    monkeypatch.setattr(ServerGroup, "_pick",
                        lambda group, episode: picked.append(pick(group, episode)) or picked[-1])
    return picked


def once_logged(run_dir, iteration: int, action) -> None:
    """On a thread: ``action()`` once ``run_dir/metrics.jsonl`` holds ``iteration``'s row."""
    import json
    import threading
    import time

    def wait() -> None:
        rows, deadline = run_dir / "metrics.jsonl", time.time() + 300
        while time.time() < deadline:
            if rows.exists() and any(json.loads(x)["iteration"] == iteration
                                     for x in rows.open()):
                action()
                return
            time.sleep(0.05)

    threading.Thread(target=wait, daemon=True).start()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def true_within(condition, seconds: float, every: float = 0.2) -> bool:
    """Whether ``condition()`` comes true within ``seconds`` (asked every ``every`` s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return False


def gone_within(pids: list[int], seconds: float) -> bool:
    return true_within(lambda: not any(alive(p) for p in pids), seconds)
