"""The step table every part reads: ragged token columns keep each row's contents through
concatenation, selection and column changes; the on-disk record of a row; the estimators'
view (anchors, an unknown entropy standing in as the NLL); the rows a rollout trains on;
state and action codes equal in every process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gaca_agent.steps import (DEFAULTS, RAGGED, SCALARS, TEXTS, Episode, Ragged, Rollout,
                              StepTable, TableBuilder, code, step_batch)


def row(t: int, **over):
    """A full step row (every column) of trajectory ``traj``."""
    values = {k: 0 for k in SCALARS if k not in DEFAULTS}
    values.update({k: "" for k in TEXTS})
    values.update(t=t, group=0, traj=0, reward=0.5 * t, env_reward=float(t), terminal=False,
                  truncated=False, format_valid=True, action_valid=True, nll=1.0 + t,
                  nll_response=2.0 + t, nll_action=3.0 + t, nll_think=4.0 + t,
                  entropy=0.25 * t, state=10 + t, next_state=11 + t, action=20 + t,
                  penalty=0.0, obs_state=30 + t, obs_next_state=31 + t,
                  observation=f"obs {t}", response=f"<action>go {t}</action>",
                  action_text=f"go {t}", state_key=f"s{t}", next_state_key=f"s{t + 1}",
                  admissible_actions=(f"go {t}", "look"), info={"score": t},
                  prompt_ids=list(range(t + 1)), completion_ids=[100 + t] * (t + 2),
                  logprobs=[-0.1 * (t + 1)] * (t + 2))
    values.update(over)
    return values


def table_of(rows, **fill):
    b = TableBuilder()
    for r in rows:
        b.append(**r)
    return b.table(**fill)


def contents(table: StepTable, i: int) -> dict:
    """Everything row ``i`` holds, as plain values."""
    out = {k: table.columns[k][i].item() for k in table.columns}
    out.update({k: "nan" for k, v in out.items() if v != v})  # NaN equals NaN here
    out.update({k: table.texts[k][i] for k in table.texts})
    out.update({k: table.ragged[k][i].tolist() for k in table.ragged})
    return out


def test_ragged_rows_keep_their_values_through_take():
    r = Ragged.from_lists([[1, 2], None, [], [3], [4, 5, 6]], np.int64)
    assert len(r) == 5 and r.lengths().tolist() == [2, 0, 0, 1, 3]
    assert [r[i].tolist() for i in range(5)] == [[1, 2], [], [], [3], [4, 5, 6]]
    assert r.values.dtype == np.int64 and r.offsets.dtype == np.int64
    picked = r.take(np.array([4, 1, 0, 4, 3]))
    assert [picked[i].tolist() for i in range(5)] == [[4, 5, 6], [], [1, 2], [4, 5, 6], [3]]
    assert picked.offsets.tolist() == [0, 3, 3, 5, 8, 9]
    empty = Ragged.from_lists([None, []], np.float64)
    assert len(empty) == 2 and empty.values.shape == (0,) and empty.values.dtype == np.float64
    as_floats = Ragged.from_lists([[0, -1]], np.float64)  # ints given: float64 kept
    assert as_floats.values.dtype == np.float64
    nothing = r.take([])
    assert len(nothing) == 0 and nothing.offsets.tolist() == [0]


def test_concatenated_tables_keep_every_rows_contents():
    a = table_of([row(0), row(1)])
    b = table_of([row(2, traj=1), row(3, traj=1, completion_ids=[], logprobs=[])])
    c = table_of([row(4, traj=2)])
    both = StepTable.concat([a, b, c])
    assert len(both) == 5
    expected = [contents(a, 0), contents(a, 1), contents(b, 0), contents(b, 1), contents(c, 0)]
    assert [contents(both, i) for i in range(5)] == expected
    for k in RAGGED:  # offsets shifted, not restarted: one flat array per column
        assert both.ragged[k].offsets[-1] == len(both.ragged[k].values)
        assert np.all(np.diff(both.ragged[k].offsets) >= 0)


def test_take_by_indices_and_by_mask_and_with_columns():
    t = table_of([row(i) for i in range(4)])
    picked = t.take([3, 1])
    assert [contents(picked, i) for i in range(2)] == [contents(t, 3), contents(t, 1)]
    masked = t.take(np.array([False, True, False, True]))
    assert [contents(masked, i) for i in range(2)] == [contents(t, 1), contents(t, 3)]
    weights = Ragged.from_lists([[1.0], [2.0], [3.0], [4.0]], np.float64)
    w = t.with_columns(advantage=np.arange(4.0), is_weight=weights)
    assert w["advantage"].tolist() == [0.0, 1.0, 2.0, 3.0] and w["is_weight"][2].tolist() == [3.0]
    assert np.isnan(t["advantage"]).all()  # the original is unchanged
    assert w["prompt_ids"] is t["prompt_ids"] and w["reward"] is t["reward"]


def test_builder_refuses_unknown_columns_and_fills_defaults():
    b = TableBuilder()
    with pytest.raises(KeyError, match="polcy_version"):
        b.append(**row(0), polcy_version=3)
    assert len(b) == 0
    b.append(**row(0))
    b.append(**row(1))
    t = b.table()
    assert t["episode"].tolist() == [0, 0] and t["failed"].tolist() == [False, False]
    assert np.isnan(t["advantage"]).all() and np.isnan(t["weight"]).all()
    filled = b.table(episode=7, failed=True, advantage=0)
    assert filled["episode"].tolist() == [7, 7] and filled["failed"].tolist() == [True, True]
    assert filled["reward"].tolist() == [0.0, 0.5]
    ints = TableBuilder()  # values given as Python ints keep each column's dtype
    ints.append(**row(0, reward=0, nll=1, entropy=0, prompt_ids=[], completion_ids=[],
                      logprobs=[]))
    for table in (filled, ints.table(), TableBuilder().table()):
        for k, dtype in SCALARS.items():
            assert table.columns[k].dtype == np.dtype(dtype), k
        for k, dtype in RAGGED.items():
            assert table.ragged[k].values.dtype == np.dtype(dtype), k


def test_record_is_the_episode_file_row():
    t = table_of([row(2), row(3, entropy=float("nan"), terminal=True, truncated=True)])
    t.columns["advantage"] = np.array([0.5, np.nan])
    r = t.record(0)
    assert r == {"t": 2, "observation": "obs 2", "admissible_actions": ["go 2", "look"],
                 "response": "<action>go 2</action>", "action": "go 2", "penalty": 0.0,
                 "format_valid": True, "action_valid": True, "reward": 1.0, "env_reward": 2.0,
                 "state_key": "s2", "next_state_key": "s3", "terminated": False,
                 "truncated": False, "nll": 3.0,
                 "nll_spans": {"response": 4.0, "action": 5.0, "think": 6.0},
                 "entropy": 0.5, "advantage": 0.5, "info": {"score": 2}}
    second = t.record(1, tokens=True)
    assert second["terminated"] is True and second["truncated"] is True
    versions = table_of([row(0, policy_version=0), row(1, policy_version=3), row(2)])
    assert [versions.record(i).get("policy_version") for i in range(3)] == [0, 3, None]
    assert second["entropy"] is None and "advantage" not in second and "weight" not in second
    assert second["prompt_ids"] == [0, 1, 2, 3] and second["response_ids"] == [103] * 5
    assert second["logprobs"] == pytest.approx([-0.4] * 5)
    second["info"]["score"] = 99  # a copy: the table keeps its own
    assert t.texts["info"][1] == {"score": 3}


def test_estimator_view_anchors_and_unknown_entropy():
    t = table_of([row(0), row(1, entropy=float("nan"))])
    s = t.scalars()
    assert s["state"].tolist() == [10, 11] and s["next_state"].tolist() == [11, 12]
    assert s.texts == {} and s.ragged == {}
    o = t.scalars(with_observation=True, anchor="observation")
    assert o["state"].tolist() == [30, 31] and o["next_state"].tolist() == [31, 32]
    assert o.texts["observation"] == ["obs 0", "obs 1"]
    with pytest.raises(ValueError, match="anchor"):
        t.scalars(anchor="text")
    t = table_of([row(0, group=3, traj=5, penalty=-0.1),
                   row(1, group=3, traj=5, entropy=float("nan"), terminal=True)])
    batch = step_batch(t)
    assert batch.entropy.tolist() == [0.0, 2.0]  # the NaN entropy is the step's NLL
    assert batch.entropy.dtype == np.float64 and batch.nll.dtype == np.float64
    assert batch.nll.tolist() == [1.0, 2.0] and batch.reward.tolist() == [0.0, 0.5]
    assert batch.state.tolist() == [10, 11] and batch.action.tolist() == [20, 21]
    assert batch.next_state.tolist() == [11, 12] and batch.terminal.tolist() == [False, True]
    assert batch.group.tolist() == [3, 3] and batch.traj.tolist() == [5, 5]
    assert batch.t.tolist() == [0, 1] and batch.penalty.tolist() == [-0.1, 0.0]
    assert batch.observation == ["obs 0", "obs 1"]
    assert step_batch(t.scalars()).observation is None


def test_rollout_trains_on_finished_episodes_and_attaches_back():
    ok = table_of([row(0), row(1)], episode=0)
    failed = table_of([row(0, traj=1)], episode=1, failed=True)
    last = table_of([row(0, traj=2)], episode=2)
    episodes = [Episode(0, 0, 0, 1, rows=range(0, 2)), Episode(0, 1, 0, 1, failed=True,
                                                              rows=range(2, 3)),
                Episode(0, 2, 0, 1, rows=range(3, 4))]
    rollout = Rollout(episodes, StepTable.concat([ok, failed, last]))
    assert rollout.train_rows.tolist() == [0, 1, 3]
    train = rollout.training_table()
    assert train["traj"].tolist() == [0, 0, 2]
    with pytest.raises(ValueError, match="3 training rows"):
        rollout.attach(advantage=np.zeros(4))
    rollout.attach(advantage=np.array([1.0, 2.0, 3.0]), weight=np.array([0.1, 0.2, 0.3]))
    adv = rollout.table["advantage"]
    assert adv[[0, 1, 3]].tolist() == [1.0, 2.0, 3.0] and np.isnan(adv[2])
    assert rollout.table["weight"][3] == pytest.approx(0.3)
    steps = rollout.steps(episodes[0])
    assert [s["t"] for s in steps] == [0, 1] and steps[1]["advantage"] == 2.0
    assert "advantage" not in rollout.steps(episodes[1])[0]
    assert "prompt_ids" not in steps[0]
    assert rollout.steps(episodes[2], tokens=True)[0]["response_ids"] == [100] * 2


def test_from_tokens_rows_are_one_trajectory_each():
    t = StepTable.from_tokens([[1, 2], [3]], [[4], [5, 6]], [[-0.5], [-0.1, -0.2]])
    assert len(t) == 2 and t["traj"].tolist() == [0, 1] and t["group"].tolist() == [0, 1]
    assert t["episode"].tolist() == [0, 1]
    assert t["completion_ids"][1].tolist() == [5, 6] and t["logprobs"][0].tolist() == [-0.5]
    assert t["terminal"].all() and t["format_valid"].all() and np.isnan(t["entropy"]).all()
    r = t.record(1)
    assert r == {"t": 0, "observation": "", "admissible_actions": [], "response": "",
                 "action": "", "penalty": 0.0, "format_valid": True, "action_valid": True,
                 "reward": 0.0, "env_reward": 0.0, "state_key": "", "next_state_key": "",
                 "terminated": True, "truncated": False, "nll": 0.0,
                 "nll_spans": {"response": 0.0, "action": 0.0, "think": 0.0},
                 "entropy": None, "info": {}}
    assert t.texts["admissible_actions"] == [(), ()] and t.texts["info"] == [{}, {}]
    assert t["state"].tolist() == [0, 0] and t["action"].tolist() == [0, 0]


CODE_IN_A_CHILD = "from gaca_agent.steps import code; print(code('kitchen: apple in fridge'))"


def test_codes_are_equal_in_every_process_and_fit_int64():
    here = code("kitchen: apple in fridge")
    there = subprocess.run([sys.executable, "-c", CODE_IN_A_CHILD], capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": "123"}).stdout
    assert int(there) == here
    texts = ["", "a", "b", "go to desk 1", "go to desk 2", "\udcff surrogate"]
    codes = [code(x) for x in texts]
    assert len(set(codes)) == len(texts)
    assert all(0 <= c < 2**63 for c in codes)
    assert np.asarray(codes, dtype=np.int64).tolist() == codes


def test_actions_are_grouped_by_their_canonical_form():
    """What ECPO, AdaStep and the others group rows by: the envs' normalisation of the
    action (case and spacing do not make another action)."""
    from gaca_agent.steps import action_code

    assert action_code("Go  to Desk 1 ") == action_code("go to desk 1")
    assert action_code("go to desk 1") != action_code("go to desk 2")
