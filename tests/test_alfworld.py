"""gaca/ALFWorld-v0 on the real engine and real game files (../shared/data/alfworld)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from gaca_envs.alfworld import games as games_mod
from gaca_envs.alfworld.games import TASK_TYPES, ALFWorldDataError, find_data_dir, list_games

from repro_probe import probe

TESTS = Path(__file__).parent


def run_expert(env, task_id: int) -> tuple[bool, int]:
    obs, info = env.reset(options={"task_id": task_id})
    steps = 0
    while True:
        action = env.unwrapped.expert_action()
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        if terminated or truncated:
            return bool(info["won"]) and reward == 1.0, steps


def test_expert_wins_first_20_valid_seen(valid_seen):
    results = [run_expert(valid_seen, k) for k in range(20)]
    wins = sum(won for won, _ in results)
    assert wins >= 18, results


def test_expert_replans_after_a_detour(valid_seen):
    obs, info = valid_seen.reset(options={"task_id": 2})
    walkthrough_first = valid_seen.unwrapped.expert_action()
    detour = next(a for a in info["admissible_actions"]
                  if a.startswith("go to") and a != walkthrough_first)
    valid_seen.step(detour)
    for _ in range(49):
        obs, reward, terminated, truncated, info = valid_seen.step(
            valid_seen.unwrapped.expert_action())
        if terminated or truncated:
            break
    assert info["won"] and reward == 1.0


def _go_until_openable(env, info):
    for action in info["admissible_actions"]:
        if not action.startswith("go to"):
            continue
        _, _, _, _, info = env.step(action)
        opens = [a for a in info["admissible_actions"] if a.startswith("open ")]
        if opens:
            return action, opens[0], info
    raise AssertionError("no openable receptacle in this game")


def test_state_key_ignores_noops_and_tracks_changes(valid_seen):
    env = valid_seen
    _, info = env.reset(options={"task_id": 0})
    start = info["state_key"]
    for noop in ("look", "inventory", "help"):
        _, _, _, _, info = env.step(noop)
        assert info["action_valid"] and info["state_key"] == start, noop
    went, open_action, info = _go_until_openable(env, info)
    at_receptacle = info["state_key"]
    assert at_receptacle != start
    examine = [a for a in info["admissible_actions"] if a.startswith("examine")]
    _, _, _, _, info = env.step(examine[0])
    assert info["action_valid"] and info["state_key"] == at_receptacle
    _, _, _, _, info = env.step(open_action)
    opened = info["state_key"]
    assert opened != at_receptacle
    _, _, _, _, info = env.step(open_action.replace("open ", "close ", 1))
    assert info["state_key"] == at_receptacle  # open then close: the same world again


def test_same_state_by_different_paths(valid_seen):
    env = valid_seen
    _, info = env.reset(options={"task_id": 0})
    gos = [a for a in info["admissible_actions"] if a.startswith("go to")]
    direct = env.step(gos[0])[4]["state_key"]
    env.reset(options={"task_id": 0})
    env.step(gos[1])
    env.step("look")
    detour = env.step(gos[0])[4]["state_key"]
    assert detour == direct
    obs_env = gym.make("gaca/ALFWorld-v0", split="valid_seen", anchor="observation")
    _, info_a = obs_env.reset(options={"task_id": 0})
    look_key = obs_env.step("look")[4]["state_key"]
    assert look_key != info_a["state_key"]  # the observation anchor splits one state in two
    obs_env.close()


def test_seeded_and_task_id_resets_match_across_processes(alfworld_dir):
    args = {"env_id": "gaca/ALFWorld-v0",
            "kwargs": {"split": "valid_seen", "data_dir": str(alfworld_dir)},
            "seed": 5, "task_id": None, "actions": ["look", "go to desk 1", "inventory"]}
    here = probe(**args)
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, str(TESTS / "repro_probe.py"), json.dumps(args)],
                             capture_output=True, text=True, env=env, cwd=TESTS, check=True)
        outputs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1] == json.loads(json.dumps(here))
    by_id = probe(**{**args, "seed": None, "task_id": here["seen"][0][2]})
    assert by_id["seen"][0][:2] == here["seen"][0][:2]


def test_task_order_types_and_info(alfworld_dir):
    games = list_games(alfworld_dir, "valid_seen")
    assert len(games) == 140
    assert [g.name for g in games] == sorted(g.name for g in games)
    env = gym.make("gaca/ALFWorld-v0", split="valid_unseen",
                   task_types=["pick_two_obj_and_place"], data_dir=alfworld_dir)
    assert env.unwrapped.num_tasks == len(list_games(alfworld_dir, "valid_unseen",
                                                     ["pick_two_obj_and_place"])) > 0
    obs, info = env.reset(seed=0)
    assert info["task_type"] == "pick_two_obj_and_place"
    assert info["task"] and info["task"] in obs
    env.close()
    with pytest.raises(ValueError, match="unknown task type"):
        list_games(alfworld_dir, "valid_seen", ["pick_and_place"])
    with pytest.raises(ValueError, match="split must be one of"):
        list_games(alfworld_dir, "test", TASK_TYPES)


def test_missing_data_names_lookup_order(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setattr(games_mod, "data_path", lambda *parts: None)
    monkeypatch.setattr(games_mod, "alfworld_cache_dir", lambda: tmp_path / "cache")
    with pytest.raises(ALFWorldDataError) as err:
        find_data_dir(None)
    text = str(err.value)
    for needle in ("data_dir argument", "$ALFWORLD_DATA", "$GACA_DATA/alfworld",
                   "alfworld-download", str(tmp_path / "cache")):
        assert needle in text


def test_an_explicit_data_folder_is_never_replaced_by_another(tmp_path, monkeypatch,
                                                               alfworld_dir):
    """data_dir= or $ALFWORLD_DATA naming a folder without the games is an error naming
    it, even when a later place of the lookup order ($GACA_DATA) holds them."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert find_data_dir(None) == alfworld_dir.resolve()  # found through $GACA_DATA
    for missing in (tmp_path / "nowhere", tmp_path):
        with pytest.raises(ALFWorldDataError, match=f"{missing} \\(the data_dir argument"):
            find_data_dir(missing)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(ALFWorldDataError, match="the \\$ALFWORLD_DATA\\): no such folder"):
        find_data_dir(None)
    # importing alfworld sets $ALFWORLD_DATA to its cache: that is not the user's choice
    monkeypatch.setenv("ALFWORLD_DATA", str(games_mod.alfworld_cache_dir()))
    import alfworld.info  # noqa: F401

    assert find_data_dir(None) == alfworld_dir.resolve()
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("GACA_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="GACA_DATA=.*nowhere: no such folder"):
        find_data_dir(None)


def test_fast_text_generation_is_byte_identical(alfworld_dir):
    """The fast path gives the unmodified engine's observations, admissible actions,
    rewards, ends, won and state keys: walkthroughs of 6 valid_seen and 6 valid_unseen
    games (one per task type) and seeded random play on 4 of them (the whole set:
    benchmarks/bench_alfworld_fastgen.py --equality)."""
    import sys

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_alfworld_fastgen import play_both, random_action

    compared = 0
    for split in ("valid_seen", "valid_unseen"):
        fast = gym.make("gaca/ALFWorld-v0", split=split, data_dir=alfworld_dir, fast_textgen=True)
        slow = gym.make("gaca/ALFWorld-v0", split=split, data_dir=alfworld_dir, fast_textgen=False)
        games = fast.unwrapped.games
        first_of_type = {}
        for k, g in enumerate(games):
            first_of_type.setdefault(g.task_type, k)
        for j, k in enumerate(sorted(first_of_type.values())):
            slow.reset(options={"task_id": k})
            plan = list(slow.unwrapped._plan or [])
            n, diff = play_both(fast, slow, k, lambda i, info: plan[i] if i < len(plan) else None)
            assert diff is None, diff
            compared += n
            if j % 3 == 0:
                rng = np.random.default_rng(k)
                n, diff = play_both(fast, slow, k, lambda i, info: random_action(rng, info), 15)
                assert diff is None, diff
                compared += n
    assert compared > 100


def test_fast_path_switches(alfworld_dir, monkeypatch):
    from gaca_envs.alfworld import fastgen

    env = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
    env.reset(options={"task_id": 0})
    assert isinstance(env.unwrapped._engine._logic.grammar, fastgen.FastGrammar)
    monkeypatch.setenv(fastgen.FAST_ENV_VAR, "0")
    off = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
    off.reset(options={"task_id": 0})
    assert not isinstance(off.unwrapped._engine._logic.grammar, fastgen.FastGrammar)
    monkeypatch.setattr(fastgen, "TEXTWORLD_VERSION", "0.0")
    with pytest.raises(fastgen.FastGenUnsupported, match="fast_textgen=False"):
        fastgen.check_version()


def test_textworld_env_speeds_up_pddl_games(alfworld_dir):
    """A .tw-pddl game played through gaca/TextWorld-v0 (TextWorld's own PddlEnv) gets the
    fast grammar, with the same outputs as without it."""
    from gaca_envs.alfworld.fastgen import FastGrammar

    game = str(list_games(alfworld_dir, "valid_seen")[3].path)
    fast = gym.make("gaca/TextWorld-v0", game=game, fast_textgen=True)
    slow = gym.make("gaca/TextWorld-v0", game=game, fast_textgen=False)
    a, b = fast.reset(options={"task_id": 0}), slow.reset(options={"task_id": 0})
    assert a == b
    assert isinstance(fast.unwrapped._engine._logic.grammar, FastGrammar)
    assert not isinstance(slow.unwrapped._engine._logic.grammar, FastGrammar)
    for _ in range(6):
        action = a[-1]["admissible_actions"][0]
        a, b = fast.step(action), slow.step(action)
        assert a == b


def test_closed_envs_hand_their_engine_on_so_memory_stays_bounded(alfworld_dir):
    """TextWorld loads a private copy of the Fast Downward library per engine and never
    unloads it; a process that opens and closes envs (a server, one per session) reuses
    the closed envs' engines, so the copies loaded stay at the most envs open at once."""
    def copies():
        with open("/proc/self/maps") as f:
            return len({line.split()[-2] if line.rstrip().endswith("(deleted)")
                        else line.split()[-1] for line in f if "libdownward" in line})

    for k in range(3):  # warm: the engines this process needs at most (two at once below)
        a = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
        b = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
        a.reset(seed=k)
        b.reset(seed=k)
        a.close()
        b.close()
    before = copies()
    for k in range(12):
        env = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
        _, info = env.reset(seed=k)
        assert info["admissible_actions"]
        env.close()
    assert copies() == before
    # a reused engine plays as a new one: two open envs, same task, same observations
    a = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
    b = gym.make("gaca/ALFWorld-v0", split="valid_seen", data_dir=alfworld_dir)
    assert a.reset(seed=5, options={"task_id": 7}) == b.reset(seed=5, options={"task_id": 7})
    assert a.unwrapped._engine.engine is not b.unwrapped._engine.engine
    a.close()
    b.close()
