"""Diagnostic envs: dynamics agree with the declared MDP, exact values agree with Monte Carlo."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from gaca_envs.diag import (Outcome, TabularMDP, exact_values, optimal_policy, softmax_policy,
                            uniform_policy)

GAMMA = 0.95


def rollout_returns(env, policy, first_action: str | None, episodes: int, seed: int):
    """Discounted returns from the start state, simulated through the env's own step()."""
    rng = np.random.default_rng(seed)
    base, mdp = env.unwrapped, None
    returns = []
    for ep in range(episodes):
        base.reset(seed=seed * 100_003 + ep, options={"task_id": 0})
        mdp = base.mdp
        g, discount, terminated, t = 0.0, 1.0, False, 0
        while not terminated and t < 500:
            s = base.state_index
            if t == 0 and first_action is not None:
                action = first_action
            else:
                action = mdp.actions[s][rng.choice(len(mdp.actions[s]), p=policy[s])]
            _, reward, terminated, _, info = base.step(action)
            assert info["action_valid"]
            g += discount * reward
            discount *= GAMMA
            t += 1
        returns.append(g)
    return np.asarray(returns)


@pytest.mark.parametrize("env_id", ["gaca/Diag-Corridor-v0", "gaca/Diag-Slippery-v0",
                                    "gaca/Diag-Keys-v0"])
def test_exact_values_match_monte_carlo(env_id):
    env = gym.make(env_id)
    env.reset(options={"task_id": 0})
    mdp = env.unwrapped.mdp
    prefs = [np.linspace(1.0, 0.0, len(a)) for a in mdp.actions]
    policy = softmax_policy(prefs, temperature=0.7)
    values = exact_values(mdp, policy, GAMMA)
    start = mdp.start
    returns = rollout_returns(env, policy, None, 3000, seed=1)
    se = returns.std() / np.sqrt(len(returns)) + 1e-9
    assert abs(returns.mean() - values.V[start]) < 4 * se + 1e-3
    for a, action in enumerate(mdp.actions[start]):
        q_returns = rollout_returns(env, policy, action, 1500, seed=2 + a)
        se = q_returns.std() / np.sqrt(len(q_returns)) + 1e-9
        assert abs(q_returns.mean() - values.Q[start][a]) < 4 * se + 1e-3
    assert policy[start] @ values.A[start] == pytest.approx(0.0, abs=1e-12)


def test_exact_values_closed_form():
    # s0 --a--> +1 terminal;  s0 --b--> s0 (reward 0). Uniform: V = 0.5 / (1 - 0.5 gamma).
    mdp = TabularMDP("toy", "toy", ("s0",), ("only state",), (("a", "b"),),
                     (((Outcome(1.0, 0, 1.0, True),), (Outcome(1.0, 0, 0.0, False),)),))
    values = exact_values(mdp, uniform_policy(mdp), 0.9)
    v = 0.5 / (1 - 0.45)
    assert values.V[0] == pytest.approx(v)
    assert values.Q[0] == pytest.approx([1.0, 0.9 * v])
    assert values.A[0] == pytest.approx([1.0 - v, 0.9 * v - v])
    with pytest.raises(ValueError, match="not a distribution"):
        exact_values(mdp, [np.array([0.7, 0.7])], 0.9)
    with pytest.raises(ValueError, match="sum to"):
        TabularMDP("bad", "bad", ("s",), ("o",), (("a",),), (((Outcome(0.5, 0, 0, True),),),))


def test_corridor_doors_are_pivotal():
    env = gym.make("gaca/Diag-Corridor-v0")
    env.reset(options={"task_id": 3})
    mdp = env.unwrapped.mdp
    near_greedy = softmax_policy([np.array([1.0, 0.0]) for _ in mdp.actions], 0.3)
    values = exact_values(mdp, near_greedy, GAMMA)
    doors = [s for s, acts in enumerate(mdp.actions) if "open the left door" in acts]
    routine = [s for s in range(mdp.num_states) if s not in doors]
    assert len(doors) == 3 and len(routine) == 9
    assert min(np.abs(values.A[s]).max() for s in doors) > \
        5 * max(np.abs(values.A[s]).max() for s in routine)


@pytest.mark.parametrize("env_id", ["gaca/Diag-Corridor-v0", "gaca/Diag-Slippery-v0",
                                    "gaca/Diag-Keys-v0"])
def test_expert_is_optimal_and_succeeds(env_id):
    env = gym.make(env_id, split="test")
    wins = 0
    for k in range(env.unwrapped.num_tasks):
        obs, info = env.reset(seed=k, options={"task_id": k})
        while True:
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
            if terminated or truncated:
                break
        wins += info["won"]
        mdp = env.unwrapped.mdp
        opt = exact_values(mdp, optimal_policy(mdp, GAMMA), GAMMA).V[mdp.start]
        assert opt >= exact_values(mdp, uniform_policy(mdp), GAMMA).V[mdp.start]
    if env_id.endswith("Corridor-v0"):
        assert wins == env.unwrapped.num_tasks
    else:  # the bridge can be slipped off, a key door jam, even under the optimal policy
        assert wins >= env.unwrapped.num_tasks // 2


def test_slippery_is_stochastic_and_seeded():
    env = gym.make("gaca/Diag-Slippery-v0", split="all")
    outcomes = set()
    for seed in range(40):
        env.reset(seed=seed, options={"task_id": 5})
        trace = [env.step("cross the bridge")[4]["state_key"]]
        for _ in range(6):
            obs, r, term, trunc, info = env.step("walk forward")
            trace.append((info["state_key"], r, term))
            if term:
                break
        outcomes.add(tuple(trace))
        env.reset(seed=seed, options={"task_id": 5})
        replay = [env.step("cross the bridge")[4]["state_key"]]
        for _ in range(len(trace) - 1):
            obs, r, term, trunc, info = env.step("walk forward")
            replay.append((info["state_key"], r, term))
        assert replay == trace  # same seed, same actions: same outcome
    assert len(outcomes) >= 2  # some seeds slip, some do not


def test_splits_and_tasks():
    train = gym.make("gaca/Diag-Corridor-v0").unwrapped
    test = gym.make("gaca/Diag-Corridor-v0", split="test").unwrapped
    assert train.num_tasks == 48 and test.num_tasks == 16
    assert test.mdp_for(0) == gym.make("gaca/Diag-Corridor-v0", split="all").unwrapped.mdp_for(48)
    tasks = {train.mdp_for(k).task for k in range(train.num_tasks)}
    assert len(tasks) > 1
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make("gaca/Diag-Corridor-v0", split="dev")


def test_simulate_follows_the_mdp_and_matches_exact_value():
    from gaca_envs.diag import simulate

    mdp = gym.make("gaca/Diag-Slippery-v0").unwrapped.mdp_for(2)
    policy = uniform_policy(mdp)
    rng = np.random.default_rng(0)
    returns = []
    for _ in range(4000):
        steps = simulate(mdp, policy, rng, max_steps=1000)
        assert steps[0].state == mdp.start and steps[-1].terminal
        for a, b in zip(steps, steps[1:]):
            assert b.state == a.next_state and not a.terminal
        returns.append(sum(GAMMA ** i * s.reward for i, s in enumerate(steps)))
    v = exact_values(mdp, policy, GAMMA).V[mdp.start]
    assert abs(np.mean(returns) - v) < 4 * np.std(returns) / np.sqrt(len(returns)) + 1e-3


def test_keys_pays_each_key_on_the_spot_and_no_door_ends_the_episode():
    """Diag-Keys: each junction is a kind with its own two actions, one of which finds the
    key (1 / 2k, paid at once); the other pays nothing and the corridor goes on, so every
    episode meets every junction; an episode is won only with every key; the states hold
    no key count (a key is paid when taken)."""
    from gaca_envs.diag.worlds import KEY_SPOTS, keys

    mdp = keys(7, level=2, jam=0.0)
    junctions = [s for s, a in enumerate(mdp.actions) if "walk forward" not in a]
    assert len(junctions) == 4 and mdp.num_states == 9
    assert all("key" not in name for name in mdp.states)
    rules = {right: wrong for _, right, wrong in KEY_SPOTS}
    for s in junctions:
        right, wrong = mdp.actions[s]
        assert rules[right] == wrong
        assert [(o.next_state, o.reward, o.terminal) for o in mdp.outcomes[s][0]] == [
            (s + 1, 0.25, False)]
        assert [(o.next_state, o.reward, o.terminal) for o in mdp.outcomes[s][1]] == [
            (s + 1, 0.0, False)]
    env = gym.make("gaca/Diag-Keys-v0", split="test")
    for right_all in (True, False):
        env.reset(seed=1, options={"task_id": 2})
        seen, total = 0, 0.0
        while True:
            state = env.unwrapped.state_index
            options = env.unwrapped.mdp.actions[state]
            expert = env.unwrapped.expert_action()
            junction = "walk forward" not in options
            action = expert if right_all or not junction else rules[expert]
            seen += junction
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            if terminated or truncated:
                break
        assert seen == 6  # level 3: every junction met, right or wrong
        if right_all:
            assert info["won"] == (total > 1 - 1e-9) and total in (
                pytest.approx(k / 6) for k in range(7))
        else:
            assert total == 0.0 and not info["won"]
    with pytest.raises(ValueError, match="level must be 1, 2, 3 or 4"):
        keys(0, level=5)
