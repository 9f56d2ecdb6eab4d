"""gaca/TextWorld-v0 on a generated game, and gaca-play driven through its terminal."""

from __future__ import annotations

import io
import subprocess
import sys

import gymnasium as gym

from gaca_envs.play import choose, play


def test_textworld_expert_wins_and_noops_keep_state(tiny_textworld_game):
    env = gym.make("gaca/TextWorld-v0", game=tiny_textworld_game)
    obs, info = env.reset(seed=0)
    assert info["task"] and env.unwrapped.num_tasks == 1
    start = info["state_key"]
    for noop in ("look", "inventory"):
        assert env.step(noop)[4]["state_key"] == start
    total = 0.0
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        total += reward
        if terminated or truncated:
            break
    assert info["won"] and terminated and total >= 1.0
    env.close()


def test_textworld_folder_of_games(tiny_textworld_game, tmp_path):
    import pathlib

    env = gym.make("gaca/TextWorld-v0", game=pathlib.Path(tiny_textworld_game).parent)
    assert env.unwrapped.num_tasks == 1
    env.close()


def test_play_numbers_text_and_expert():
    env = gym.make("gaca/Diag-Corridor-v0", split="test")
    env.reset(options={"task_id": 0})
    mdp = env.unwrapped.mdp
    env.step("walk forward"), env.step("rest"), env.step("not an action")
    rest_of_first = 1  # expert steps that finish episode 1 after those three
    while env.step(env.unwrapped.expert_action())[2] is False:
        rest_of_first += 1
    env.reset(options={"task_id": 0})
    whole = 1
    while env.step(env.unwrapped.expert_action())[2] is False:
        whole += 1
    # two whole episodes: play goes on after the first one ends, until the input ends
    script = ("\n\n2\nrest\nnot an action\n" + ":expert\n" * rest_of_first
              + "\n:expert\n" * whole)
    out = io.StringIO()
    returns = play(env, seed=0, task_id=0, stdin=io.StringIO(script), stdout=out)
    text = out.getvalue()
    assert text.count("Task 0: " + mdp.task) == 3  # episodes 1 and 2, and the one begun
    assert "(not admissible: 'not an action')" in text
    assert "(not admissible: '')" not in text  # empty lines are not steps
    assert "(expert) walk forward" in text
    assert returns == [1.0, 1.0] and text.count("won, return 1") == 2
    assert f"Episode over after {3 + rest_of_first} steps" in text
    assert f"Episode over after {whole} steps" in text
    assert choose("1", ("a", "b")) == "a" and choose("9", ("a",)) == "9"


def test_play_counts_long_action_lists_and_lists_them_on_demand(monkeypatch):
    import gaca_envs.play as play_module

    env = gym.make("gaca/Diag-Corridor-v0", split="test")
    n = len(env.reset(options={"task_id": 0})[1]["admissible_actions"])
    monkeypatch.setattr(play_module, "LIST_LIMIT", n - 1)  # as if the list were long
    out = io.StringIO()
    play(env, seed=0, task_id=0, stdin=io.StringIO(":actions\n1\n"), stdout=out)
    text = out.getvalue()
    assert f"({n} admissible actions: :actions lists them numbered)" in text
    assert text.count("    1. ") == 1  # printed once, by :actions, then "1" is played
    assert "(not admissible" not in text


def test_play_cli_quits_cleanly():
    cmd = [sys.executable, "-m", "gaca_envs.play", "gaca/Diag-Slippery-v0", "split=test",
           "--task-id", "1"]
    out = subprocess.run(cmd, input="1\n:quit\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "river bank" in out.stdout and "bye" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "gaca_envs.play", "gaca/Nope-v0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown env" in bad.stderr
    bogus = subprocess.run([sys.executable, "-m", "gaca_envs.play", "gaca/Diag-Corridor-v0",
                            "split=bogus"], capture_output=True, text=True, timeout=60)
    assert bogus.returncode == 2 and "split must be one of" in bogus.stderr
    assert "Traceback" not in bogus.stderr
