"""The learner's rows packed as prefix trees (``learner.pack_prefixes``): each shared
prompt prefix forwarded once, the same log-probs and the same update."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install -e '.[train]')")

from test_learner import capture_grads, make_learner, params, samples  # noqa: E402


def test_each_row_sees_exactly_its_own_prompt_and_completion_in_the_packed_sequence():
    import numpy as np

    from gaca_agent.learner.packing import plan_packing, tree_mask

    prompts = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4], [9, 8], [1, 2, 3, 4, 6]]
    comps = [[10, 11], [12], [13, 14, 15], [16], [17, 18]]
    plan = plan_packing(prompts, comps)
    # rows 0, 1, 2 and 4 share [1, 2, 3] (one sequence), row 3 packs alone
    assert len(plan.tokens) == 2
    assert plan.sequence_of[0] == plan.sequence_of[1] == plan.sequence_of[2] == plan.sequence_of[4]
    assert sum(len(t) for t in plan.tokens) < sum(len(p) + len(c) for p, c in zip(prompts, comps))
    for r, (prompt, comp) in enumerate(zip(prompts, comps)):
        s = plan.sequence_of[r]
        tokens, positions = plan.tokens[s], plan.position_ids[s]
        mask = tree_mask(torch.as_tensor(plan.branch[s])[None])[0, 0].numpy()
        for j, at in enumerate(plan.predicts[r]):
            seen = np.flatnonzero(mask[at])  # what the token predicting comp[j] attends to
            assert tokens[seen].tolist() == (prompt + comp)[:len(prompt) + j]
            assert positions[seen].tolist() == list(range(len(prompt) + j))
            # and the next token in the row is the one it predicts
            assert (prompt + comp)[len(prompt) + j] == comp[j]


def shared_prefix_table(tok, n=6):
    """Rows whose prompts share their start (a task's steps), some the whole prompt."""
    import numpy as np

    from gaca_agent.steps import StepTable

    base, adv = samples(tok, n=n)
    head = tok("You are in a maze. Your task is to find the exit. " * 2)["input_ids"]
    prompts = [head + list(base["prompt_ids"][i % 3]) for i in range(n)]
    comps = [list(base["completion_ids"][i]) for i in range(n)]
    lps = [np.asarray(base["logprobs"][i]) for i in range(n)]
    return StepTable.from_tokens(prompts, comps, lps), adv


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_give_the_padded_batchs_log_probs(tiny_model_path, attention):
    import numpy as np

    from gaca_agent.learner.batch import PAD
    from gaca_agent.learner.logprobs import forward_token_logprobs
    from gaca_agent.learner.packing import micro_inputs, pack_batch

    learner, tok = make_learner(tiny_model_path)
    table, _ = shared_prefix_table(tok)
    rows = np.array([0, 3, 1, PAD, 4, 2, 5])
    model = learner.unwrapped.eval()
    model.set_attn_implementation(attention)  # eager takes the mask as additive floats
    out = {}
    for name, packed_for in (("pad", None), ("pack", model)):
        b = micro_inputs(table, rows, learner.pad_id, "cpu", packed_for)
        with torch.no_grad():
            out[name] = forward_token_logprobs(
                model, b["input_ids"], b["attention_mask"], b["positions"], b["targets"],
                1.0, True, b.get("position_ids"), sequence_of=b.get("sequence_of"))
        out[name + "_mask"] = b["mask"]
    mask = out["pad_mask"].bool()
    assert torch.equal(out["pack_mask"], out["pad_mask"])
    for k in (0, 1):  # log-probs, entropies
        assert torch.allclose(out["pack"][k][mask], out["pad"][k][mask], atol=1e-5)
    packed = pack_batch(table, rows, learner.pad_id, "cpu")
    assert packed["input_ids"].shape[0] < len(rows)  # rows of one prefix: one sequence


def test_an_update_of_packed_rows_is_the_padded_update(tiny_model_path):
    """The recompute, reference and policy passes over prefix trees: the same gradients,
    parameters and metrics as over padded rows, with fewer tokens forwarded."""
    seen = {}
    for pack in (False, True):
        learner, tok = make_learner(tiny_model_path, micro_batch_size=3, mini_batch_rows=4,
                                    old_logprobs="recompute", tis_cap=1.5, log_entropy=True,
                                    pack_prefixes=pack)
        table, adv = shared_prefix_table(tok, n=8)
        tokens = []
        learner.unwrapped.register_forward_pre_hook(
            lambda _, args, kw: tokens.append(int(kw["input_ids"].numel())), with_kwargs=True)
        grads = capture_grads(learner)
        metrics = learner.update(table, adv)
        seen[pack] = (sum(tokens), grads, params(learner.unwrapped), metrics)
    (t_pad, g_pad, p_pad, m_pad), (t_pack, g_pack, p_pack, m_pack) = seen[False], seen[True]
    assert t_pack < 0.8 * t_pad
    for key in ("train/tokens", "losses/policy", "losses/kl", "losses/clip_frac",
                "losses/entropy", "train/is_ratio_mean", "train/rollout_logprob_gap"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-4, abs=1e-7), key
    assert set(g_pack) == set(g_pad)
    assert all(torch.allclose(g_pack[k], g_pad[k], rtol=1e-3, atol=1e-6) for k in g_pad)
    assert max(float((p_pack[k] - p_pad[k]).abs().max()) for k in p_pad) < 1e-4


def test_packing_is_refused_where_the_attention_ignores_a_custom_mask():
    from types import SimpleNamespace

    from gaca_agent.learner.packing import check_attention

    check_attention(SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa")))
    with pytest.raises(ValueError, match="pack_prefixes: false"):
        check_attention(SimpleNamespace(config=SimpleNamespace(
            _attn_implementation="flash_attention_2")))
