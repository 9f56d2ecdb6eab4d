"""gaca-audit (anchors vs the true state), gaca-rescore (one batch, every estimator) and
the study's paired statistics."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from gaca_agent.analysis.audit import anchors, audit, measure


def rows(specs):
    """Step rows from (group, canonical state, observation text) triples."""
    return [{"env": "e", "task_type": "t", "group": g, "state": s, "text": x}
            for g, s, x in specs]


def test_alias_and_split_rates_by_hand():
    # group 1: "Nothing happens." seen in two different states (alias); state B seen
    # under two texts (split); group 2 repeats a text in one state (no alias, no split)
    r = rows([(1, "A", "You arrive."), (1, "A", "You arrive."), (1, "B", "Nothing happens."),
              (1, "C", "Nothing happens."), (1, "B", "You look around."),
              (2, "A", "You arrive."), (2, "A", "You arrive."), (2, "D", "Alone.")])
    text = measure(r, anchors(r, "text", 0.9))
    # text groups: (1,arrive)x2, (1,nothing)x2 [aliased], (1,look)x1, (2,arrive)x2, (2,alone)x1
    assert text["anchor_groups"] == 5 and text["singleton_frac"] == pytest.approx(2 / 8)
    assert text["alias_rate"] == pytest.approx(1 / 3)  # 1 of 3 groups of two or more
    assert text["alias_row_share"] == pytest.approx(2 / 8)
    # states seen twice or more: (1,A), (1,B), (2,A); split: (1,B) under two texts
    assert text["split_rate"] == pytest.approx(1 / 3)
    assert text["split_row_share"] == pytest.approx(2 / 8)
    state = measure(r, anchors(r, "state", 0.9))
    assert state["alias_rate"] == state["split_rate"] == 0.0
    assert state["anchor_groups"] == 5  # (1,A), (1,B), (1,C), (2,A), (2,D)
    similar = measure(r, anchors(r, "similar", 0.5))
    assert similar["alias_rate"] >= text["alias_rate"]


def test_similarity_clusters_merge_near_identical_texts_across_states():
    r = rows([(1, f"seg{i}", f"Corridor, segment {i} of 12. The passage continues ahead.")
              for i in range(1, 9)])
    out = audit(r, similarity=0.9)["e"]
    assert out["all"]["text"]["alias_rate"] == 0.0
    assert out["all"]["similar@0.9"]["alias_rate"] == 1.0  # one cluster of 8 states


def test_audit_and_rescore_on_a_grouped_evaluation(tmp_path):
    """gaca-eval --group-size writes task groups; gaca-audit and gaca-rescore read them
    (on a Diag env the rescore includes the exact advantages)."""
    from gaca_agent.cli.audit import main as audit_main
    from gaca_agent.eval.evaluate import Evaluation, evaluate
    from gaca_agent.cli.rescore import main as rescore_main

    out = tmp_path / "eval"
    res = evaluate(Evaluation("gaca/Diag-Slippery-v0", "random", 3, {"split": "test"},
                              group_size=6), out, progress=False)
    assert res["n"] == 18
    records = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(18))
    assert {r["group"] for r in records} == {0, 1, 2}
    seeds = {r["group"]: set() for r in records}
    for r in records:
        seeds[r["group"]].add(r["seed"])
    assert all(len(s) == 1 for s in seeds.values())  # a group shares its seed
    assert audit_main([str(out)]) == 0
    table = json.loads((out / "audit.json").read_text())["results"]
    assert table["gaca/Diag-Slippery-v0"]["all"]["state"]["rows"] == sum(r["steps"] for r in records)
    assert rescore_main([str(out), "--estimators", "grpo,gigpo,gaca,pgpo,ecpo"]) == 0
    result = json.loads((out / "rescore" / "rescore.json").read_text())
    assert result["rows"] == sum(r["steps"] for r in records) and result["groups"] == 3
    assert set(result["estimators"]) == {"grpo", "gigpo", "gaca", "pgpo", "ecpo"}
    assert set(result["sign_changes"]) == {"grpo", "gaca", "pgpo", "ecpo"}
    assert result["sign_changes"]["gaca"]["flipped"] == 0  # scripted: GACA is GiGPO
    assert "Signs against GiGPO's" in (out / "rescore" / "rescore.md").read_text()
    assert result["exact_rows"] > 0
    for entry in result["estimators"].values():
        assert -1 <= entry["exact_corr"] <= 1 and entry["exact_mse"] >= 0
    assert result["spearman"]["gigpo|gaca"] == pytest.approx(1.0)  # scripted: NLL 0


def test_rescore_exact_advantages_match_the_empirical_policy():
    """On a Diag task whose rows all take one action in a state, the empirical policy is
    deterministic there and the exact advantage of that action is 0."""
    from gaca_agent.analysis.rescore import exact_advantages
    import gymnasium as gym

    import gaca_envs

    gym.register_envs(gaca_envs)
    env = gym.make("gaca/Diag-Corridor-v0", split="test")
    obs, info = env.reset(options={"task_id": 2})
    row = {"task_id": 2, "state_key": info["state_key"], "action": "walk forward",
           "action_valid": True}
    mask, truth = exact_advantages([row, dict(row)], {"env": "gaca/Diag-Corridor-v0",
                                                     "env_kwargs": {"split": "test"}}, 0.95)
    assert mask.all() and np.allclose(truth, 0.0)


def test_paired_statistics_and_sign_test():
    from gaca_agent.analysis.significance import sign_test, t_interval

    assert sign_test([1, 1, 1, 1, 1, 1, 1, 1, 1, 1]) == pytest.approx(2 / 1024)
    assert sign_test([1, -1, 0, 0]) == 1.0
    assert sign_test([0.1] * 8 + [-0.1] * 2) == pytest.approx(
        2 * sum(math.comb(10, i) for i in range(3)) / 1024)
    mean, half = t_interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    # past the table (a 16-seed study): Student's quantile, not the normal one (1.96)
    _, half = t_interval([0.0, 1.0] * 8)
    assert half == pytest.approx(2.131 * statistics.stdev([0.0, 1.0] * 8) / 4, abs=1e-3)


def test_screening_keeps_the_first_seeds_inside_the_bounds_and_reports_the_rest(tmp_path):
    """A study's seed rule, applied to the warm-up alone: seeds are tried in pool order,
    strictly inside (low, high), only until enough are kept; a failed screening run is
    excluded; every verdict lands in screen.json; and the kept seeds are the ones the
    study plans its runs with."""
    from gaca_agent.analysis.screen import Screen, screen
    from gaca_agent.analysis.study import Preset, Run, plan

    warm = {0: 0.0, 1: 0.25, 2: 0.9, 3: None, 4: 0.5, 5: 0.95, 6: 0.3, 7: 0.4}
    ran = []

    def execute(run, folder):
        ran.append(run.seed)
        assert "iterations=1" in run.overrides and "eval_every=1" in run.overrides
        if warm[run.seed] is None:
            return run, False, "failed"
        (folder / "runs" / run.name).mkdir(parents=True)
        (folder / "runs" / run.name / "metrics.jsonl").write_text(
            json.dumps({"iteration": -1, "eval/success": warm[run.seed]}) + "\n"
            + json.dumps({"iteration": 0, "eval/success": 1.0}) + "\n")
        return run, True, "ok"

    def make_run(seed, overrides):
        return Run("w", "gaca/Diag-Signs-v0", "screen", seed, [f"seed={seed}", *overrides])

    rule = Screen(pool=tuple(range(8)), keep=3, low=0.0, high=0.9)
    kept = screen(rule, "w", ["env.groups=2"], tmp_path, 2, execute, make_run)
    assert kept == [1, 4, 6]
    assert sorted(ran) == [0, 1, 2, 3, 4, 5, 6]  # one seed was missing: seed 7 never ran
    record = json.loads((tmp_path / "screen.json").read_text())["w"]
    assert record["kept"] == [1, 4, 6]
    assert record["seeds"]["2"] == {"warmup_success": 0.9, "kept": False}  # the bound is strict
    assert record["seeds"]["3"] == {"warmup_success": None, "kept": False}
    preset = Preset(envs=(("w", "gaca/Diag-Signs-v0"),), seeds=(0,), overrides=(),
                    labels=("grpo", "gaca-k2"))
    runs = plan(preset, {"w": kept})
    assert sorted((r.label, r.seed) for r in runs) == [
        ("gaca-k2", 1), ("gaca-k2", 4), ("gaca-k2", 6), ("grpo", 1), ("grpo", 4), ("grpo", 6)]
    assert any('"kappa": 2.0' in o for o in runs[-1].overrides + runs[0].overrides)


def test_a_run_folders_name_gives_back_its_environment_label_and_seed():
    """What reads a study's folders (the checkpoint benchmark) finds each run's label and
    seed from its name, including labels with dashes, and skips other folders."""
    from gaca_agent.analysis.study import Run

    run = Run("pivots", "gaca/Diag-Pivots-v0", "gaca-k2", 17)
    assert Run.parse(run.name) == ("pivots", "gaca-k2", 17)
    for other in ("pivots__gaca", "pivots__gaca__seed3", "pivots__gaca__s", "a__b__s1__s2"):
        assert Run.parse(other) is None


def test_the_per_seed_table_shows_each_labels_curve_after_the_shared_warm_up(tmp_path):
    from gaca_agent.analysis.study import Run
    from gaca_agent.analysis.study_report import seed_markdown

    curves = {("gigpo", 3): [0.25, 0.5, 0.75], ("gaca", 3): [0.25, 0.5, 1.0],
              ("gigpo", 7): [0.125, 0.0, 0.5]}
    runs = []
    for (label, seed), points in curves.items():
        run = Run("w", "gaca/Diag-Pivots-v0", label, seed)
        runs.append(run)
        (tmp_path / "runs" / run.name).mkdir(parents=True)
        (tmp_path / "runs" / run.name / "metrics.jsonl").write_text("".join(
            json.dumps({"iteration": it, "eval/success": v}) + "\n"
            for it, v in zip((-1, 1, 3), points)))
    text = seed_markdown(tmp_path, runs)
    assert "| seed | warm-up | gigpo | gaca |" in text
    assert "| 3 | 0.25 | 0.50 0.75 | 0.50 1.00 |" in text
    assert "| 7 | 0.12 | 0.00 0.50 | - |" in text


def test_sign_changes_count_flips_and_name_the_anchors_where_they_happen():
    import numpy as np

    from gaca_agent.analysis.rescore import sign_changes

    rows = [{"group": 0, "state_key": k, "action": a} for k, a in
            [("door", "open left"), ("door", "open right"), ("door", "open left"),
             ("hall", "walk"), ("hall", "rest"), ("hall", "walk")]]
    rows.append({"group": 1, "state_key": "door", "action": "open left"})  # another group's
    reference = np.array([1.0, -1.0, 1.0, 0.5, -0.5, 0.2, 1.0])
    ours = np.array([-0.2, -1.0, -0.1, 0.0, 0.5, 0.2, -1.0])
    out = sign_changes(ours, reference, rows, "state")
    assert out["flipped"] == pytest.approx(4 / 7) and out["zeroed"] == pytest.approx(1 / 7)
    assert [(a["anchor"], a["flipped"], a["rows"], a["actions"]) for a in out["anchors"]] == [
        ("door", 2, 3, ["open left"]), ("hall", 1, 3, ["rest"]), ("door", 1, 1, ["open left"])]


def test_the_paired_table_shows_a_tiny_sign_test_p_value_not_zero():
    """16 wins of 16 give p = 2 / 2^16: the table must say so, not print 0.000."""
    from gaca_agent.analysis.significance import sign_test
    from gaca_agent.analysis.study_report import paired_markdown

    def metric(diffs):
        return {"mean": 0.1, "ci95": [0.05, 0.15], "wins": sum(d > 0 for d in diffs),
                "losses": sum(d < 0 for d in diffs), "ties": 0, "sign_test_p": sign_test(diffs),
                "sign_test_holm": min(1.0, 2 * sign_test(diffs)), "t_test_p": 0.04,
                "t_test_holm": 0.08}

    text = paired_markdown({"w": {"gigpo - grpo": {
        "seeds": list(range(16)), "final": metric([0.1] * 16),
        "auc": metric([0.1] * 9 + [-0.1])}}})
    assert "| 16 / 0 / 0 | 0.04 (0.08) | 3.05e-05 (6.1e-05) |" in text
    assert "| 9 / 1 / 0 | 0.04 (0.08) | 0.0215 (0.043) |" in text


@pytest.mark.parametrize("df, quantile, p", [(9, 2.262, 0.05), (9, 3.250, 0.01),
                                             (4, 2.776, 0.05), (23, 2.069, 0.05),
                                             (23, 2.807, 0.01), (1, 12.706, 0.05)])
def test_the_paired_t_tests_p_value_at_students_published_quantiles(df, quantile, p):
    """Differences whose t statistic is Student's published two-sided quantile have that
    p value (the 95% and 99% points; either sign)."""
    from gaca_agent.analysis.significance import t_test

    n = df + 1
    base = [(-1.0) ** i * (1 + i % 3) for i in range(n)]
    base = [b - sum(base) / n for b in base]  # mean 0
    sd = statistics.stdev(base)
    shift = quantile * sd / math.sqrt(n)
    assert t_test([b + shift for b in base]) == pytest.approx(p, abs=2e-4)
    assert t_test([-b - shift for b in base]) == pytest.approx(p, abs=2e-4)
    assert t_test([0.3] * n) == 0.0 and t_test([0.0] * n) == 1.0 and t_test([0.2]) == 1.0


def test_holm_multiplies_the_kth_smallest_by_m_minus_k_and_keeps_the_order():
    from gaca_agent.analysis.significance import holm

    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    # the running maximum: the second smallest (0.021 x 2 = 0.042) may not fall below the
    # first's adjusted 0.06
    assert holm([0.021, 0.02, 0.9]) == pytest.approx([0.06, 0.06, 0.9])
    assert holm([0.4, 0.3]) == pytest.approx([0.6, 0.6])
    assert holm([0.7, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_a_studys_auc_columns_subtract_to_its_paired_differences(tmp_path):
    """aggregate()'s AUC per label and paired()'s AUC differences use one definition (the
    warm-up's point included): over the same seeds the columns subtract to the paired
    mean; and paired() gives each comparison the t test and Holm over the comparisons."""
    import json

    from gaca_agent.analysis.significance import holm, t_test
    from gaca_agent.analysis.study import Run, aggregate, paired

    curves = {"gigpo": [[0.1, 0.4, 0.6], [0.0, 0.5, 0.5], [0.2, 0.2, 0.9]],
              "grpo": [[0.3, 0.2, 0.5], [0.2, 0.3, 0.5], [0.0, 0.4, 0.4]],
              "spread": [[0.9, 0.4, 0.6], [0.0, 0.6, 0.7], [0.2, 0.3, 0.9]]}
    runs = []
    for label, per_seed in curves.items():
        for seed, curve in enumerate(per_seed):
            run = Run("keys", "gaca/Diag-Keys-v0", label, seed)
            (tmp_path / "runs" / run.name).mkdir(parents=True)
            (tmp_path / "runs" / run.name / "metrics.jsonl").write_text("\n".join(
                json.dumps({"iteration": it, "eval/success": v})
                for it, v in zip((-1, 1, 3), curve)))
            runs.append(run)
    summary = aggregate(tmp_path, runs)["keys"]
    pairs = [("gigpo", "grpo"), ("spread", "gigpo")]
    result = paired(tmp_path, runs, pairs)["keys"]
    for a, b in pairs:
        auc = result[f"{a} - {b}"]["auc"]
        assert summary[a]["auc"]["mean"] - summary[b]["auc"]["mean"] == \
            pytest.approx(auc["mean"])
        assert auc["t_test_p"] == pytest.approx(t_test(auc["differences"]))
    for metric in ("final", "auc", "drop", "late_sd"):
        for test in ("t_test", "sign_test"):
            raw = [result[f"{a} - {b}"][metric][f"{test}_p"] for a, b in pairs]
            assert [result[f"{a} - {b}"][metric][f"{test}_holm"] for a, b in pairs] == \
                pytest.approx(holm(raw))
            assert all(h >= p for h, p in zip(holm(raw), raw))


def test_paired_differences_equal_a_plain_computation(tmp_path):
    """paired() over run folders: per seed, a - b of the final held-out success and of
    the AUC (the mean over every evaluation, the warm-up's at iteration -1 included),
    their mean, Student's 95% interval, wins / losses / ties and the sign test, each
    equal to the computation written out by hand."""
    import json
    import math
    import statistics

    from gaca_agent.analysis.study import Run, paired

    curves = {("gigpo", 1): [0.1, 0.4, 0.6], ("grpo", 1): [0.3, 0.2, 0.5],
              ("gigpo", 2): [0.0, 0.5, 0.5], ("grpo", 2): [0.2, 0.3, 0.5],
              ("gigpo", 3): [0.2, 0.2, 0.9], ("grpo", 3): [0.0, 0.4, 0.4],
              ("grpo", 4): [0.0, 0.0, 0.0]}  # no gigpo run of seed 4: not paired
    runs = []
    for (label, seed), curve in curves.items():
        run = Run("keys", "gaca/Diag-Keys-v0", label, seed)
        (tmp_path / "runs" / run.name).mkdir(parents=True)
        rows = [{"iteration": it, "eval/success": v} for it, v in zip((-1, 1, 3), curve)]
        rows.append({"iteration": 0, "rollout/success": 0.9})  # not an evaluation
        (tmp_path / "runs" / run.name / "metrics.jsonl").write_text(
            "\n".join(json.dumps(r) for r in rows))
        runs.append(run)
    got = paired(tmp_path, runs, [("gigpo", "grpo")])["keys"]["gigpo - grpo"]
    assert got["seeds"] == [1, 2, 3]
    final = [0.6 - 0.5, 0.5 - 0.5, 0.9 - 0.4]
    auc = [(0.1 + 0.4 + 0.6) / 3 - (0.3 + 0.2 + 0.5) / 3,
           (0.0 + 0.5 + 0.5) / 3 - (0.2 + 0.3 + 0.5) / 3,
           (0.2 + 0.2 + 0.9) / 3 - (0.0 + 0.4 + 0.4) / 3]
    for metric, diffs in (("final", final), ("auc", auc)):
        entry = got[metric]
        assert entry["differences"] == pytest.approx(diffs)
        mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
        half = 4.303 * sd / math.sqrt(3)  # Student's t, 2 degrees of freedom
        assert entry["mean"] == pytest.approx(mean)
        assert entry["ci95"] == pytest.approx([mean - half, mean + half])
        assert entry["sd"] == pytest.approx(sd)
    assert (got["final"]["wins"], got["final"]["losses"], got["final"]["ties"]) == (2, 0, 1)
    assert got["final"]["sign_test_p"] == pytest.approx(0.5)  # 2 of 2 untied: 2 x 1/4
    assert abs(auc[1]) < 1e-12 and (got["auc"]["wins"], got["auc"]["losses"]) == (2, 0)
    # stability: the largest fall from one evaluation to the next (0 if none), and the
    # population SD of the last four evaluations (here all three)
    drop = [0.0 - 0.1, 0.0 - 0.0, 0.0 - 0.0]  # gigpo never fell; grpo fell 0.1 on seed 1
    late = [statistics.pstdev(curves[("gigpo", s)]) - statistics.pstdev(curves[("grpo", s)])
            for s in (1, 2, 3)]
    assert got["drop"]["differences"] == pytest.approx(drop)
    assert got["late_sd"]["differences"] == pytest.approx(late)
    assert (got["drop"]["wins"], got["drop"]["losses"], got["drop"]["ties"]) == (0, 1, 2)


@pytest.mark.parametrize("df, quantile", [(1, 12.706), (5, 2.571), (12, 2.179), (13, 2.160),
                                          (15, 2.131), (20, 2.086), (23, 2.069),
                                          (30, 2.042), (60, 2.000), (120, 1.980)])
def test_t95_is_students_quantile(df, quantile):
    """The table's values, and the expansion past it within 0.0015 of Student's quantile
    (the published values)."""
    from gaca_agent.analysis.significance import t95

    assert t95(df) == pytest.approx(quantile, abs=0.0015)
