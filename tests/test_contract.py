"""Every registered gaca/ id honours the environment contract of SPEC.md."""

from __future__ import annotations

import shutil

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import gaca_envs
from gaca_envs.core import TEXT_CHARSET, normalize_action, stable_hash, to_charset
from gaca_envs.registration import SPECS

from conftest import alfworld_data_or_skip, has_module

gym.register_envs(gaca_envs)
INFO_KEYS = {"admissible_actions", "state_key", "task", "task_id", "won", "action_valid"}
BAD_ACTIONS = ["", " ", "x" * 100_000, "go to\x00\x07\x1b[31m desk", "gé 到 \U0001f600 🙂",
               "\n\t\r", "look" * 5000, "__import__('os')"]


def kwargs_or_skip(env_id: str, tiny_game, request) -> dict:
    """The kwargs the tests make ``env_id`` with (skips when its extras are missing).
    ``gaca/Remote-v0`` is tested against a served Diag-Signs env."""
    spec = gaca_envs.registration.spec_of(env_id)
    if spec.id == "gaca/AgentGym-v0":
        pytest.skip("needs an AgentGym server: tests/test_env_server.py plays one")
    if spec.id == "gaca/Remote-v0":
        return {"url": request.getfixturevalue("diag_server"), "expert": True}
    missing = [m for m in spec.requires if not has_module(m)]
    if missing:
        pytest.skip(f"{spec.id} needs {missing} (pip install -e '.[alfworld]')")
    kwargs: dict = {}
    if spec.id == "gaca/ALFWorld-v0":
        kwargs = {"split": "valid_seen", "data_dir": alfworld_data_or_skip()}
    elif spec.id == "gaca/TextWorld-v0":
        kwargs = {"game": tiny_game}
    elif spec.id == "gaca/ScienceWorld-v0":
        if shutil.which("java") is None:
            pytest.skip("no Java runtime: bash scripts/setup.sh scienceworld installs it")
        kwargs = {"split": "test", "task_types": "lifespan-longest-lived"}
    elif spec.id.startswith("gaca/WebShop"):
        kwargs = {"split": "test"}
        if spec.id == "gaca/WebShopBrowser-v0" and not (shutil.which("chromium")
                                                         and shutil.which("chromedriver")):
            pytest.skip("headless browser missing: apt-get install chromium chromium-driver")
    return kwargs


@pytest.fixture(scope="module", params=[s.id for s in SPECS])
def env(request, tiny_textworld_game):
    env = gym.make(request.param, **kwargs_or_skip(request.param, tiny_textworld_game, request))
    yield env
    env.close()


def test_check_env(env):
    check_env(env.unwrapped, skip_render_check=True)


def test_reset_info_and_task_ids(env):
    obs, info = env.reset(options={"task_id": 0})
    assert INFO_KEYS <= set(info)
    assert env.observation_space.contains(obs)
    assert info["task_id"] == 0 and info["action_valid"] is True and info["won"] is False
    assert isinstance(info["admissible_actions"], tuple) and info["admissible_actions"]
    assert all(a == normalize_action(a) for a in info["admissible_actions"])
    n = env.unwrapped.num_tasks
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": n})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"tsk_id": 0})


def test_seed_and_task_id_reproducible(env):
    first = env.reset(seed=11)
    again = env.reset(seed=11)
    assert first[0] == again[0] and first[1]["state_key"] == again[1]["state_key"]
    by_id = env.reset(options={"task_id": first[1]["task_id"]})
    assert by_id[0] == first[0]


@pytest.mark.parametrize("action", BAD_ACTIONS, ids=range(len(BAD_ACTIONS)))
def test_bad_actions_are_noops(env, action):
    obs, info = env.reset(options={"task_id": 0})
    obs2, reward, terminated, truncated, info2 = env.step(action)
    assert info2["action_valid"] is False
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info2["state_key"] == info["state_key"]
    assert info2["admissible_actions"] == info["admissible_actions"]
    assert env.observation_space.contains(obs2)


def test_non_string_action_is_invalid(env):
    env.reset(options={"task_id": 0})
    for action in (None, 3, b"look", ["look"]):
        assert env.step(action)[4]["action_valid"] is False


def test_valid_action_is_taken(env):
    obs, info = env.reset(options={"task_id": 0})
    action = info["admissible_actions"][0]
    _, _, _, _, info2 = env.step("  " + action.upper() + " ")
    assert info2["action_valid"] is True


def test_observation_anchor_option(env):
    spec_kwargs = dict(env.spec.kwargs)
    other = gym.make(env.spec.id, **{**spec_kwargs, "anchor": "observation"})
    obs, info = other.reset(options={"task_id": 0})
    assert info["state_key"] == stable_hash(["observation", obs])
    other.close()


def test_steps_after_the_end_are_no_ops(env):
    """One behaviour for every id: after termination a step changes nothing, pays 0, keeps
    terminated=True, lists no admissible action and reports action_valid=False."""
    env.reset(options={"task_id": 0})
    for _ in range(60):
        action = env.unwrapped.expert_action()
        obs, reward, terminated, truncated, info = env.step(action or "look")
        if terminated or truncated:
            break
    assert terminated, "the expert should finish task 0"
    assert info["admissible_actions"] == ()
    final_obs, final_key, won = obs, info["state_key"], info["won"]
    for action in ("look", "click[buy now]", "walk forward", "go to desk 1", ""):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (0.0, True, False), action
        assert info["action_valid"] is False and info["admissible_actions"] == ()
        assert obs == final_obs and info["state_key"] == final_key and info["won"] == won


@pytest.mark.parametrize("env_id", [s.id for s in SPECS])
def test_async_vector_env_returns_the_real_observations(env_id, tiny_textworld_game, request):
    """gymnasium's AsyncVectorEnv (shared memory on, its default) works out of the box."""
    kwargs = kwargs_or_skip(env_id, tiny_textworld_game, request)
    single = gym.make(env_id, **kwargs)
    expected = [single.reset(seed=s)[0] for s in (3, 4)]
    first_action = single.reset(seed=3)[1]["admissible_actions"][0]
    step_obs = single.step(first_action)[0]
    single.close()
    vec = gym.make_vec(env_id, 2, vectorization_mode="async", **kwargs)
    try:
        obs, infos = vec.reset(seed=[3, 4])
        assert list(obs) == expected
        obs, *_ = vec.step([first_action, "not an action"])
        assert obs[0] == step_obs and obs[1] == "Nothing happens."
    finally:
        vec.close()


def test_helpers():
    assert stable_hash(["ab", "c"]) != stable_hash(["a", "bc"])
    assert to_charset("café ☕\n") == "cafe ?\n"
    assert all(c in TEXT_CHARSET for c in to_charset("\x00\u2603" * 10))
    assert len(to_charset("a" * 100, limit=50)) == 50
    assert normalize_action("  Go   TO desk 1 ") == "go to desk 1"
