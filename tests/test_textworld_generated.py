"""gaca/TextWorld-v0's generated games (``generate=``): the same spec makes the same games
anywhere, game i is seed + i, a failed generation leaves nothing behind; and an Inform
game's feedback as a player reads it."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from conftest import has_module
from gaca_envs.alfworld import generated
from gaca_envs.alfworld.env import inform_text

needs_textworld = pytest.mark.skipif(
    not has_module("textworld"), reason="textworld not installed (pip install -e '.[alfworld]')")
SPEC = {"count": 2, "seed": 5, "rooms": 2, "objects": 3, "quest_length": 2}


def quests(folder):
    """Each game's quest commands, read from the .json TextWorld writes beside it."""
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.name != "spec.json":
            data = json.loads(path.read_text())
            out.append([q["commands"] for q in data["quests"]])
    return out


@needs_textworld
def test_a_spec_makes_the_same_games_anywhere_and_game_i_is_seed_plus_i(tmp_path,
                                                                      monkeypatch, capsys):
    first = generated.generated_games(SPEC, root=tmp_path / "a")
    # minutes of work at a run's start say what they are doing, once
    assert f"making 2 TextWorld games into {first}" in capsys.readouterr().err
    assert sorted(p.name for p in first.glob("*.z8")) == ["game-0.z8", "game-1.z8"]
    assert json.loads((first / "spec.json").read_text()) == SPEC
    with monkeypatch.context() as patch:  # a second use makes nothing
        patch.setattr(generated, "make_one", lambda *a: pytest.fail("made again"))
        assert generated.generated_games(SPEC, root=tmp_path / "a") == first
    assert "making" not in capsys.readouterr().err
    again = generated.generated_games(SPEC, root=tmp_path / "b")  # another machine
    assert quests(again) == quests(first)
    shifted = generated.generated_games({**SPEC, "seed": 6}, root=tmp_path / "a")
    assert shifted != first and quests(shifted)[0] == quests(first)[1]
    assert quests(first)[0] != quests(first)[1]


@needs_textworld
def test_the_env_plays_a_specs_games_and_the_expert_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("GACA_CACHE", str(tmp_path))
    env = gym.make("gaca/TextWorld-v0", generate=SPEC, max_episode_steps=10)
    assert env.unwrapped.num_tasks == 2
    for task in range(2):
        obs, info = env.reset(seed=0, options={"task_id": task})
        assert info["task"] and obs.startswith(info["task"])  # the objective comes first
        assert "$$" not in obs and "\n>" not in obs
        done = False
        while not done:
            obs, reward, done, truncated, info = env.step(env.unwrapped.expert_action())
            done = done or truncated
        assert info["won"] and reward == 1.0
    env.close()
    with pytest.raises(ValueError, match="one of the two"):
        gym.make("gaca/TextWorld-v0")
    with pytest.raises(ValueError, match="one of the two"):
        gym.make("gaca/TextWorld-v0", game=tmp_path, generate=SPEC)


@needs_textworld
def test_a_generation_that_fails_midway_leaves_no_folder(tmp_path, monkeypatch):
    made = []
    real = generated.make_one

    def fail_second(path, *args):
        if made:
            raise RuntimeError("inform7 crashed")
        made.append(path)
        return real(path, *args)

    monkeypatch.setattr(generated, "make_one", fail_second)
    with pytest.raises(RuntimeError, match="inform7 crashed"):
        generated.generated_games(SPEC, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the set nor its scratch folder
    monkeypatch.setattr(generated, "make_one", real)
    assert len(list(generated.generated_games(SPEC, root=tmp_path).glob("*.z8"))) == 2


@pytest.mark.parametrize("bad, message", [
    ({"rooms": 0}, r"generate.rooms must be an integer >= 1, got 0"),
    ({"count": True}, r"generate.count must be an integer >= 1, got True"),
    ({"seed": -1}, r"generate.seed must be an integer >= 0, got -1"),
    ({"quest_length": 2.5}, r"generate.quest_length must be an integer"),
    ({"room": 3}, r"unknown keys \['room'\]"),
])
def test_a_bad_spec_is_refused_before_anything_is_made(bad, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        generated.generated_games(bad, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_spec_folders_differ_for_any_difference_and_not_for_defaults(tmp_path):
    base = generated.spec_folder({}, tmp_path)
    assert generated.spec_folder(dict(generated.DEFAULTS), tmp_path) == base
    for key in generated.DEFAULTS:
        other = {**generated.DEFAULTS, key: generated.DEFAULTS[key] + 1}
        assert generated.spec_folder(other, tmp_path) != base, key


def test_inform_feedback_loses_banner_prompt_and_status_line():
    raw = ("\n\n\n                    ________  ________ \n"
           "                   |        \\|        \\\n"
           "                    \\$$$$$$$$| $$$$$$$$\n\n"
           "Welcome! First, open the locker. Then take the key.\n\n"
           "-= Cellar =-\nYou've entered a cellar.\n\n\n\nThere is a key > on the floor.\n\n"
           ">                    -= Cellar =-0/3")
    assert inform_text(raw) == ("Welcome! First, open the locker. Then take the key.\n\n"
                                "-= Cellar =-\nYou've entered a cellar.\n\n"
                                "There is a key > on the floor.")
    assert inform_text("\nYou unlock the box.\n\n\n>   ") == "You unlock the box."
    assert inform_text("You see a line of dashes: ____ here.\n>") == \
        "You see a line of dashes: ____ here."
