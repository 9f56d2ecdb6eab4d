"""Estimators: vectorised versions equal the plain-loop references; invariants hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gaca_agent.advantages import StepBatch, compute, get, names, register
from gaca_agent.advantages.gaca import GACAConfig

import reference_estimators as ref

FIELDS = ("group", "traj", "t", "reward", "state", "next_state", "action", "nll", "terminal",
          "entropy")


def random_rows(rng, n_groups=3, n_traj=4, max_len=6, n_states=4, n_actions=3,
                entropy=True, sparse=False):
    rows, traj = [], 0
    for g in range(n_groups):
        for _ in range(n_traj):
            length = int(rng.integers(1, max_len + 1))
            states = rng.integers(0, n_states, size=length + 1)
            terminated = bool(rng.integers(2))
            for t in range(length):
                last = t == length - 1
                reward = float(rng.integers(2)) if (last or not sparse) else 0.0
                rows.append({"group": g, "traj": traj, "t": t, "reward": reward,
                             "state": int(states[t]), "next_state": int(states[t + 1]),
                             "action": int(rng.integers(n_actions)),
                             "nll": float(rng.random() * 3),
                             "terminal": last and terminated,
                             "entropy": float(rng.random()) if entropy else None})
            traj += 1
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]  # rows arrive in any order


def to_batch(rows) -> StepBatch:
    cols = {f: np.array([r[f] for r in rows]) for f in FIELDS if f != "entropy"}
    ent = None if rows[0]["entropy"] is None else np.array([r["entropy"] for r in rows])
    return StepBatch(**cols, entropy=ent)


CASES = [
    ("grpo", {}), ("grpo", {"norm": "mean"}), ("grpo", {"episode_stats": "steps"}),
    ("rloo", {}), ("reinforce_pp", {}),
    ("gigpo", {}), ("gigpo", {"norm": "mean", "omega": 0.6, "gamma": 0.9}),
    ("gigpo", {"episode_stats": "steps"}),
    ("gaca", {}), ("gaca", {"form": "sigmoid", "kappa": 0.7}),
    ("gaca", {"form": "convex", "kappa": 0.4}), ("gaca", {"scope": "group", "kappa": 1.5}),
    ("gaca", {"scope": "batch", "norm": "mean", "w_max": 1.5}),
    ("adastep", {}), ("adastep", {"norm": "mean"}),
    ("pgpo", {}), ("pgpo", {"alpha": 1.0, "beta": 0.5, "norm": "mean"}),
    ("graft", {}), ("graft", {"lam": 0.0, "gamma": 0.9}),
    ("empg", {}), ("empg", {"k": 2.0, "zeta": 0.3}),
    ("ecpo", {}), ("ecpo", {"kappa": 0.5, "gate": False, "norm": "mean"}),
    ("ecpo", {"kappa": 0.0, "omega": 0.5, "tau": 1.5}), ("ecpo", {"tau": 40.0, "gamma": 0.9}),
    ("ecpo_scaled", {}), ("ecpo_scaled", {"kappa": 0.5, "gate": False, "norm": "mean"}),
    ("ecpo_scaled", {"kappa": 0.0, "omega": 0.5}),
    ("shrink", {}), ("shrink", {"norm": "mean", "omega": 2.0}),
    ("spread", {}), ("spread", {"w_max": 1.5, "norm": "mean"}),
]


@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("seed", range(4))
def test_vectorised_equals_reference(name, params, seed):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, n_states=3 if seed % 2 else 5, entropy=seed != 1)
    adv, diag = compute(name, to_batch(rows), **params)
    expected = ref.REFERENCE[name](rows, **params)
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-6)
    assert set(diag) == {"singleton_frac", "anchor_group_size", "weight_mean", "weight_std",
                         "weight_step_corr", "zero_variance_groups"}


def test_torch_tensors_accepted():
    torch = pytest.importorskip("torch")
    rows = random_rows(np.random.default_rng(0))
    batch = to_batch(rows)
    tensors = StepBatch(**{f: torch.as_tensor(getattr(batch, f)) for f in FIELDS})
    np.testing.assert_allclose(compute("gaca", tensors)[0], compute("gaca", batch)[0])


def test_registry_errors():
    with pytest.raises(KeyError, match="valid: .*'gaca'.*'grpo'"):
        get("gigpo2")
    with pytest.raises(TypeError, match="unknown parameter.*valid: .*kappa"):
        compute("gaca", to_batch(random_rows(np.random.default_rng(0))), kapa=0.1)
    with pytest.raises(ValueError, match="already registered"):
        register("gaca", GACAConfig)(lambda p, c: None)
    with pytest.raises(ValueError, match="norm must be one of"):
        compute("gigpo", to_batch(random_rows(np.random.default_rng(0))), norm="l2")
    with pytest.raises(ValueError, match="needs the step rows' `nll`"):
        rows = random_rows(np.random.default_rng(0))
        b = to_batch(rows)
        compute("gaca", StepBatch(b.group, b.traj, b.t, b.reward, b.state))
    assert names() == sorted(["grpo", "rloo", "reinforce_pp", "gigpo", "gaca", "adastep",
                              "pgpo", "graft", "empg", "ecpo", "ecpo_scaled", "shrink",
                              "spread"])


def test_the_configs_estimator_field_names_every_registered_estimator():
    """``algo.estimator``'s documentation lists them all (it once named 9 of 12)."""
    import ast
    import inspect

    from gaca_agent.config import sections

    tree = ast.parse(inspect.getsource(sections.AlgoSection))
    body = tree.body[0].body
    doc = next(body[i + 1].value.value for i, node in enumerate(body)
               if isinstance(node, ast.AnnAssign) and node.target.id == "estimator")
    listed = {w.strip(" ,.") for w in doc.split(":", 1)[1].split("(")[0].split()}
    assert listed == set(names())


def test_lambda_alias_and_bad_t():
    b = to_batch(random_rows(np.random.default_rng(1)))
    np.testing.assert_allclose(compute("graft", b, **{"lambda": 0.5})[0],
                               compute("graft", b, lam=0.5)[0])
    bad = StepBatch([0, 0], [0, 0], [0, 2], [1.0, 0.0], [1, 2])
    with pytest.raises(ValueError, match="0..T-1"):
        compute("grpo", bad)


# ------------------------------------------------------------------ properties
rows_strategy = st.builds(
    lambda seed, groups, trajs, states, sparse: random_rows(
        np.random.default_rng(seed), groups, trajs, 5, states, 2, sparse=sparse),
    st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4),
    st.booleans())
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(rows_strategy, st.sampled_from(names()))
def test_finite_and_permutation_equivariant(rows, name):
    batch = to_batch(rows)
    adv, diag = compute(name, batch)
    assert np.all(np.isfinite(adv)) and all(np.isfinite(v) for v in diag.values())
    perm = np.random.default_rng(len(rows)).permutation(len(rows))
    adv_perm, _ = compute(name, to_batch([rows[i] for i in perm]))
    np.testing.assert_allclose(adv_perm, adv[perm], atol=1e-9)


@SETTINGS
@given(rows_strategy, st.sampled_from(["grpo", "rloo", "gigpo", "gaca", "adastep", "pgpo",
                                       "graft"]))
def test_no_leakage_across_groups(rows, name):
    adv, _ = compute(name, to_batch(rows))
    changed = [dict(r) for r in rows]
    for r in changed:
        if r["group"] != 0:
            r["reward"] = r["reward"] * 3 + 1
            r["nll"] += 1.0
    adv2, _ = compute(name, to_batch(changed))
    in_group0 = np.array([r["group"] == 0 for r in rows])
    np.testing.assert_allclose(adv2[in_group0], adv[in_group0], atol=1e-9)


@SETTINGS
@given(rows_strategy, st.floats(-5, 5))
def test_grpo_shift_invariance_and_zero_sum(rows, shift):
    # Shift every trajectory's return by the same amount: add it to each first step.
    adv, _ = compute("grpo", to_batch(rows))
    shifted = [dict(r, reward=r["reward"] + (shift if r["t"] == 0 else 0.0)) for r in rows]
    np.testing.assert_allclose(compute("grpo", to_batch(shifted))[0], adv, atol=1e-6)
    per_traj = {r["traj"]: (r["group"], a) for r, a in zip(rows, adv)}
    for g in {r["group"] for r in rows}:
        assert abs(sum(a for gg, a in per_traj.values() if gg == g)) < 1e-6


@SETTINGS
@given(rows_strategy, st.sampled_from(["linear", "sigmoid"]),
       st.sampled_from(["trajectory", "group", "batch"]))
def test_gaca_reduces_to_gigpo(rows, form, scope):
    batch = to_batch(rows)
    gigpo, _ = compute("gigpo", batch, omega=0.8)
    kappa0, _ = compute("gaca", batch, omega=0.8, kappa=0.0, form=form, scope=scope)
    np.testing.assert_array_equal(kappa0, gigpo)
    flat = StepBatch(**{**batch.__dict__, "nll": np.full(len(rows), 1.3)})
    equal_nll, _ = compute("gaca", flat, omega=0.8, kappa=0.5, form=form, scope=scope)
    np.testing.assert_array_equal(equal_nll, gigpo)


@SETTINGS
@given(rows_strategy, st.sampled_from(["linear", "sigmoid", "convex"]))
def test_gaca_singletons_get_episode_advantage(rows, form):
    batch = to_batch(rows)
    adv, _ = compute("gaca", batch, form=form, kappa=0.9)
    episode, _ = compute("grpo", batch)
    keys = [(r["group"], r["state"]) for r in rows]
    single = np.array([keys.count(k) == 1 for k in keys])
    np.testing.assert_allclose(adv[single], episode[single], atol=1e-12)


@SETTINGS
@given(st.integers(0, 10_000), st.sampled_from(["linear", "sigmoid", "convex"]),
       st.sampled_from(["trajectory", "group", "batch"]))
def test_gaca_weight_monotone_in_nll(seed, form, scope):
    from gaca_agent.advantages import prepare
    from gaca_agent.advantages.gaca import criticality
    from gaca_agent.advantages.stats import segment_count

    rows = random_rows(np.random.default_rng(seed), 2, 4, 6, 2, 2)
    p = prepare(to_batch(rows))
    nll = np.array([r["nll"] for r in rows])
    scope_ids = {"trajectory": p.traj, "group": p.group, "batch": np.zeros(p.n, np.int64)}[scope]
    eligible = segment_count(p.anchor)[p.anchor] >= 2
    z = criticality(nll, scope_ids, eligible)
    cfg = GACAConfig(kappa=0.6, form=form, scope=scope)
    w = {"linear": np.clip(1 + cfg.kappa * z, cfg.w_min, cfg.w_max),
         "sigmoid": 2 / (1 + np.exp(-cfg.kappa * z)),
         "convex": np.clip(cfg.lambda_bar + cfg.kappa * z, 0, 1)}[form]
    for s in np.unique(scope_ids):
        idx = np.flatnonzero((scope_ids == s) & eligible)
        order = idx[np.argsort(nll[idx], kind="stable")]
        assert np.all(np.diff(w[order]) >= -1e-12)


@SETTINGS
@given(rows_strategy)
def test_adastep_weight_in_unit_interval(rows):
    from gaca_agent.advantages import prepare
    from gaca_agent.advantages.adastep import shrinkage

    p = prepare(to_batch(rows))
    w = shrinkage(p.returns_to_go(0.95), p.anchor, np.array([r["action"] for r in rows]))
    assert np.all((w >= 0) & (w <= 1))


def test_zero_variance_and_singleton_groups_are_finite():
    rows = [{"group": 0, "traj": 0, "t": 0, "reward": 1.0, "state": 0, "next_state": 1,
             "action": 0, "nll": 0.5, "terminal": True, "entropy": 0.1}]
    rows += [dict(rows[0], group=1, traj=1), dict(rows[0], group=1, traj=2)]
    for name in names():
        adv, diag = compute(name, to_batch(rows))
        assert np.all(np.isfinite(adv)), name
    assert compute("grpo", to_batch(rows))[1]["zero_variance_groups"] == 1.0
    assert compute("gigpo", to_batch(rows))[1]["singleton_frac"] == pytest.approx(1 / 3)


def test_similarity_grouping_merges_near_identical_observations():
    rows = random_rows(np.random.default_rng(3), 1, 4, 4, 6, 2)
    texts = [f"You are at desk {r['state'] % 2}. It is {'dark' if r['state'] > 2 else 'lit'}."
             for r in rows]
    batch = StepBatch(**{**to_batch(rows).__dict__, "observation": texts})
    exact, d_exact = compute("gigpo", batch)
    merged, d_merged = compute("gigpo", batch, similarity=0.8)
    assert d_merged["anchor_group_size"] > d_exact["anchor_group_size"]
    same, _ = compute("gigpo", batch, similarity=1.0)
    texts_per_state = {}
    for r, t in zip(rows, texts):
        texts_per_state.setdefault(t, set()).add(r["state"])
    if all(len(v) == 1 for v in texts_per_state.values()) and \
            len(texts_per_state) == len({r["state"] for r in rows}):
        np.testing.assert_allclose(same, exact)


def test_details_give_per_row_weights_and_step_advantages():
    rows = random_rows(np.random.default_rng(5), 2, 4, 5, 3, 2)
    batch = to_batch(rows)
    adv, diag, extra = compute("gaca", batch, details=True, kappa=0.5)
    a_e, _ = compute("grpo", batch)
    np.testing.assert_allclose(adv, a_e + extra["weight"] * extra["step_adv"], atol=1e-12)
    assert diag["weight_mean"] == pytest.approx(extra["weight"].mean())
    _, _, gig = compute("gigpo", batch, details=True, omega=0.7)
    assert np.all(gig["weight"] == 0.7)
    _, _, grpo = compute("grpo", batch, details=True)
    assert not grpo["weight"].any() and not grpo["step_adv"].any()


def one_anchor(actions, returns):
    """One task group whose trajectories all start in state 0 (then part ways), the
    given first actions and returns (one reward at the last step)."""
    n = len(actions)
    return StepBatch(group=np.zeros(2 * n, int), traj=np.repeat(np.arange(n), 2),
                     t=np.tile([0, 1], n), reward=np.ravel([[0.0, r] for r in returns]),
                     state=np.ravel([[0, 1 + i] for i in range(n)]),
                     action=np.ravel([[a, 9] for a in actions]))


def test_calibrated_credit_shrinks_a_rare_lucky_action_and_keeps_a_decisive_one():
    """Divergent anchor bias: action 1, taken once, scored 1 by luck while action 0 scored
    0/1 alike. GiGPO gives its row a large step advantage; ECPO (a count of 1 against the
    pseudo-count, a gate by the between-action share) and the James-Stein mixture (noise as
    large as the spread) give it little. Where the action decides (0 always 0, 1 always 1)
    both keep GiGPO's sign and most of its size, and the spread proxy weighs it above the
    noisy anchor."""
    lucky = one_anchor([0, 0, 0, 0, 0, 0, 0, 1], [0, 1, 0, 1, 0, 1, 0, 1])
    decisive = one_anchor([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1])
    first = np.arange(0, 16, 2)  # the rows at the shared state

    def step(name, batch):
        _, _, rows = compute(name, batch, details=True, gamma=1.0, norm="mean")
        return (rows["weight"] * rows["step_adv"])[first]

    gigpo_lucky = step("gigpo", lucky)[-1]
    assert gigpo_lucky > 0.4
    for name in ("ecpo", "ecpo_scaled"):
        assert 0 <= step(name, lucky)[-1] < 0.2 * gigpo_lucky, name
    assert step("shrink", lucky)[-1] == pytest.approx(0.0, abs=1e-9)
    gigpo_decisive = step("gigpo", decisive)
    for name in ("ecpo", "ecpo_scaled", "shrink"):
        calibrated = step(name, decisive)
        assert np.all(np.sign(calibrated) == np.sign(gigpo_decisive)), name
        assert np.all(np.abs(calibrated) >= 0.6 * np.abs(gigpo_decisive)), name
    both = StepBatch(*[np.concatenate([getattr(lucky, f), getattr(decisive, f) + (
        1 if f == "group" else 8 if f == "traj" else 0)]) for f in
        ("group", "traj", "t", "reward", "state")], action=np.concatenate(
        [lucky.action, decisive.action]))
    weights = compute("spread", both, details=True, gamma=1.0, norm="mean")[2]["weight"]
    assert weights[16] > 1.0 > weights[0]  # the decisive anchor above the lucky one


def test_the_group_filter_keeps_exactly_the_groups_whose_returns_differ():
    from gaca_agent.advantages.batch import rows_of_groups_with_spread

    # group 9: returns 1 and 0 (kept); group 4: partial scores 0.75 and 0.5 (kept);
    # group 2: both 0, differing only in a row penalty (alike: left out)
    batch = StepBatch(group=[9, 9, 9, 4, 4, 4, 2, 2], traj=[0, 0, 1, 2, 2, 3, 4, 5],
                      t=[0, 1, 0, 0, 1, 0, 0, 0], reward=[0, 1, 0, 0.25, 0.5, 0.5, 0, 0],
                      state=[0] * 8, penalty=[0, 0, 0, 0, 0, 0, -0.1, 0])
    keep = rows_of_groups_with_spread(batch)
    assert keep.tolist() == [True] * 6 + [False] * 2
    won_alike = StepBatch(group=[1, 1, 1], traj=[0, 0, 1], t=[0, 1, 0], reward=[0, 1, 1],
                          state=[0, 1, 0])
    assert not rows_of_groups_with_spread(won_alike).any()  # both returned 1, by 2 routes
    # equal partial returns are alike to the filter and to the logged "groups alike" both
    # (a std over them is 1e-17, not 0)
    tenths = StepBatch(group=[0, 0, 0], traj=[0, 1, 2], t=[0, 0, 0], reward=[0.1] * 3,
                       state=[0] * 3)
    assert not rows_of_groups_with_spread(tenths).any()
    assert compute("grpo", tenths)[1]["zero_variance_groups"] == 1.0
    empty = StepBatch(group=[], traj=[], t=[], reward=[], state=[])
    assert rows_of_groups_with_spread(empty).shape == (0,)
