"""Loss maths and the learner: gradients, accumulation, masking, KL, LoRA."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from gaca_agent.learner.losses import aggregate, kl_penalty, ppo_clip_loss  # noqa: E402


def test_clipped_loss_at_ratio_one_has_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.tensor([1.5, -0.5, 2.0])
    mask = torch.ones(3, 5)
    loss, clip_frac = ppo_clip_loss(logp, logp.detach(), adv, mask, agg="token-mean")
    loss.backward()
    expected = -adv[:, None].expand(3, 5) / 15  # -A * d log p, averaged over 15 tokens
    assert torch.allclose(logp.grad, expected) and clip_frac == 0


def test_clipping_stops_the_gradient_beyond_the_clip_range():
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # ratio e ~ 2.7 on the first token
    loss, clip_frac = ppo_clip_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2),
                                    clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0 and clip_frac == 0.5


@pytest.mark.parametrize("ratio, adv, clipped", [
    (1.25, 1.0, False),   # inside 1 + clip_high = 1.28, outside 1 + clip_low = 1.2
    (1.30, 1.0, True),    # beyond 1 + clip_high
    (0.78, -1.0, True),   # below 1 - clip_low = 0.8 (inside 1 - clip_high = 0.72)
    (0.85, -1.0, False),  # inside 1 - clip_low
    (0.75, -1.0, True),   # beyond 1 - clip_low
    (0.75, 1.0, False),   # a positive advantage is never clipped below
])
def test_each_clip_bound_acts_on_its_own_side(ratio, adv, clipped):
    """clip_low = 0.2 bounds ratios below 1 and clip_high = 0.28 above: ratios between the
    two bounds tell a swapped pair apart."""
    import math

    logp = torch.zeros(1, 1, requires_grad=True)
    old = torch.tensor([[-math.log(ratio)]])
    loss, frac = ppo_clip_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1),
                               clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert (logp.grad[0, 0] == 0) == clipped and (frac == 1.0) == clipped
    bounded = min(max(ratio, 0.8), 1.28)
    assert float(loss.detach()) == pytest.approx(-min(ratio * adv, bounded * adv), rel=1e-5)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    import math

    ratio = 5.0  # far above 1 + clip_high, with a negative advantage
    logp = torch.zeros(1, 1, requires_grad=True)
    old = torch.tensor([[-math.log(ratio)]])
    plain, _ = ppo_clip_loss(logp, old, torch.tensor([-2.0]), torch.ones(1, 1))
    assert float(plain.detach()) == pytest.approx(ratio * 2.0, rel=1e-5)  # unbounded
    loss, frac = ppo_clip_loss(logp, old, torch.tensor([-2.0]), torch.ones(1, 1),
                               clip_ratio_c=3.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(3.0 * 2.0) and frac == 1.0
    assert logp.grad[0, 0] == 0  # capped: no gradient
    two, _ = ppo_clip_loss(logp.detach(), old, torch.tensor([-2.0]), torch.ones(1, 1),
                           clip_ratio_c=2.0)
    assert float(two) == pytest.approx(2.0 * 2.0)  # the cap follows c: -c A
    below, _ = ppo_clip_loss(torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1),
                             torch.tensor([-2.0]), torch.ones(1, 1), clip_ratio_c=3.0)
    assert float(below) == pytest.approx(2.0 * 2.0, rel=1e-5)  # under the cap: unchanged
    pos, _ = ppo_clip_loss(logp.detach(), old, torch.tensor([2.0]), torch.ones(1, 1),
                           clip_ratio_c=3.0)
    assert float(pos) == pytest.approx(-1.28 * 2.0, rel=1e-5)  # positive A: no dual clip


def test_masked_tokens_get_no_gradient_and_aggregations():
    logp = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    loss, _ = ppo_clip_loss(logp, logp.detach(), torch.tensor([1.0, 2.0]), mask,
                            agg="seq-mean-token-mean")
    loss.backward()
    assert torch.all(logp.grad[0, 2:] == 0) and torch.all(logp.grad[0, :2] != 0)
    v = torch.tensor([[1.0, 3.0, 100.0, 100.0], [2.0, 2.0, 2.0, 2.0]])
    assert aggregate(v, mask, "token-mean") == pytest.approx(12 / 6)
    assert aggregate(v, mask, "seq-mean-token-mean") == pytest.approx((2 + 2) / 2)
    assert aggregate(v, mask, "token-mean", denominator=12) == pytest.approx(1.0)


def test_kl_estimators():
    a, b = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert torch.allclose(kl_penalty(a, b, "k1"), torch.tensor([0.5, 0.0]))
    assert torch.allclose(kl_penalty(a, b, "k2"), torch.tensor([0.125, 0.0]))
    k3 = kl_penalty(a, b, "low_var_kl")
    assert k3[1] == 0 and k3[0] == pytest.approx(float(torch.exp(torch.tensor(-0.5)) + 0.5 - 1))
    with pytest.raises(ValueError, match="kl kind"):
        kl_penalty(a, b, "k4")


def samples(tokenizer, n=8, seed=0):
    """(a StepTable of n rows, their advantages)."""
    import random

    import numpy as np

    from gaca_agent.steps import StepTable

    rng = random.Random(seed)
    prompts, comps, lps, adv = [], [], [], []
    for i in range(n):
        prompts.append(tokenizer(f"Corridor, segment {i} of 12. " * (1 + i % 3))["input_ids"])
        c = tokenizer("<think>go</think><action>walk forward</action>")["input_ids"][: 3 + i % 4]
        comps.append(c)
        lps.append([-rng.uniform(0.5, 3.0) for _ in c])
        adv.append(rng.uniform(-1, 1))
    return StepTable.from_tokens(prompts, comps, lps), np.asarray(adv)


def make_learner(path, **kw):
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.learner.core import Learner, LearnerConfig

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path)
    cfg = LearnerConfig(**{"lr": 1e-2, "kl_coef": 0.05, **kw})
    return Learner(path, tok, cfg, Accelerator(cpu=True)), tok


def test_a_process_wide_mixed_precision_is_refused_not_added(tiny_model_path,
                                                            fresh_accelerate):
    """An earlier Accelerator left bf16 autocast in the process (TRL's trainers default to
    it): the learner, which casts itself, refuses to start rather than update in bf16."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.learner.core import Learner, LearnerConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    leaked = Accelerator(cpu=True, mixed_precision="bf16")
    for acc in (None, leaked):  # its own accelerator, or one handed in
        with pytest.raises(ValueError, match="learner.bf16.*autocasts to bf16"):
            Learner(tiny_model_path, tok, LearnerConfig(), acc)


def capture_grads(learner):
    """Record the gradients the optimizer is about to apply."""
    seen = {}
    step = learner.optimizer.step

    def wrapped(*args, **kwargs):
        for name, p in learner.unwrapped.named_parameters():
            if p.grad is not None:
                seen[name] = p.grad.detach().clone()
        return step(*args, **kwargs)

    learner.optimizer.step = wrapped
    return seen


def params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_one_update_changes_trainable_parameters(tiny_model_path):
    learner, tok = make_learner(tiny_model_path)
    before = params(learner.unwrapped)
    table, adv = samples(tok)
    metrics = learner.update(table, adv)
    after = params(learner.unwrapped)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["train/tokens"] == table["completion_ids"].lengths().sum()
    assert metrics["losses/kl"] >= 0 and 0 <= metrics["losses/clip_frac"] <= 1


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_accumulate_to_the_same_update(tiny_model_path, agg):
    a, tok = make_learner(tiny_model_path, micro_batch_size=1, loss_agg=agg)
    b, _ = make_learner(tiny_model_path, micro_batch_size=4, loss_agg=agg)
    batch = samples(tok, n=4)
    grads = [capture_grads(a), capture_grads(b)]
    a.update(*batch)
    b.update(*batch)
    ga, gb = grads
    assert ga and set(ga) == set(gb)
    # the accumulated gradient is the same (Adam's first step, ~lr * sign(g), would
    # amplify rounding in near-zero components, so gradients are compared, then params)
    assert all(torch.allclose(ga[k], gb[k], rtol=1e-4, atol=1e-7) for k in ga)
    # The parameters after that step: a wrong accumulation would move nearly every
    # element by ~lr (0.01); rounding moves a handful (measured: 2 of 124,416 by 1.4e-5,
    # after the tokenizer's training text changed) by ~1e-5.
    pa, pb = params(a.unwrapped), params(b.unwrapped)
    total = sum(v.numel() for v in pa.values())
    off = sum(int((~torch.isclose(pa[k], pb[k], rtol=0, atol=1e-5)).sum()) for k in pa)
    assert off <= total // 10_000
    assert max(float((pa[k] - pb[k]).abs().max()) for k in pa) < 1e-4


def test_micro_batches_hold_rows_of_similar_length():
    """Each micro-batch is padded to its longest row: rows go in by length, so a batch
    of mixed lengths pads little; chunks stay ``size`` rows, then padding chunks."""
    import numpy as np

    from gaca_agent.learner.batch import PAD, micro_batches

    lengths = np.array([900, 450, 880, 470, 0, 1100])  # row 4 is not in this mini-batch
    rows = np.array([0, 1, 2, 3, 5])
    chunks = micro_batches(rows, 2, 4, lengths)
    assert [c.tolist() for c in chunks] == [[1, 3], [2, 0], [5], [PAD]]

    def padded(chunks):
        return sum(len(c) * lengths[c].max() for c in chunks if PAD not in c)

    assert padded(chunks) == 2 * 470 + 2 * 900 + 1100 < padded(micro_batches(rows, 2, 4))


def test_an_update_forwards_rows_of_similar_length_together(tiny_model_path):
    learner, tok = make_learner(tiny_model_path, micro_batch_size=2, kl_coef=0.0)
    table, adv = samples(tok, n=6)
    widths: list[int] = []
    learner.unwrapped.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    learner.update(table, adv)
    lengths = sorted(table["prompt_ids"].lengths() + table["completion_ids"].lengths())
    assert sorted(widths) == sorted(max(lengths[i:i + 2]) for i in range(0, 6, 2))


def observed_update(learner, table, adv):
    """One update, observed: (the rows each forward pass had, the gradients the optimizer
    applied, the parameters after, the metrics)."""
    rows = []
    forward = learner._logprobs

    def counting(model, batch, *a):
        rows.append(int((batch["mask"].sum(1) > 0).sum()))
        return forward(model, batch, *a)

    learner._logprobs = counting
    grads = capture_grads(learner)
    metrics = learner.update(table, adv)
    return rows, grads, params(learner.unwrapped), metrics


@pytest.mark.parametrize("old, passes", [("rollout", 0), ("recompute", 1)])
def test_rows_with_advantage_zero_are_not_forwarded_and_the_update_is_unchanged(
        tiny_model_path, old, passes):
    """Sparse rewards: with the PPO term alone, a row whose advantage is 0 has no gradient,
    so the update does not forward it (nor recompute its old log-probs), and the
    parameters move exactly as when every row is forwarded (as they are while entropy is
    logged). A mini-batch of such rows only still takes its optimizer step (one padding
    pass)."""
    import numpy as np

    seen = {}
    for name, kw in (("skip", {}), ("all", {"log_entropy": True})):
        learner, tok = make_learner(tiny_model_path, kl_coef=0.0, micro_batch_size=2,
                                    mini_batch_rows=4, old_logprobs=old, **kw)
        table, adv = samples(tok, n=8)
        adv[[0, 1, 2, 3, 5]] = 0.0  # the first mini-batch's rows all 0
        seen[name] = observed_update(learner, table, adv)
    (rows_s, g_s, p_s, m_s), (rows_a, g_a, p_a, m_a) = seen["skip"], seen["all"]
    assert sum(rows_s) == 3 * (1 + passes) and sum(rows_a) == 8 * (1 + passes)
    # a padding pass for mini-batch 1, rows 4 | 6, 7 for mini-batch 2 (and 4, 6 | 7 before)
    assert len(rows_s) == 3 + 2 * passes
    assert m_s["train/skipped_rows_frac"] == pytest.approx(5 / 8)
    assert m_a["train/skipped_rows_frac"] == 0.0
    for key in ("train/tokens", "train/opt_steps", "losses/clip_frac", "losses/policy"):
        assert m_s[key] == pytest.approx(m_a[key], rel=1e-5, abs=1e-9), key
    assert set(g_s) == set(g_a)
    assert all(torch.allclose(g_s[k], g_a[k], rtol=1e-4, atol=1e-7) for k in g_a)
    assert max(float((p_s[k] - p_a[k]).abs().max()) for k in p_a) < 1e-4


def test_identical_rows_are_found_by_their_token_ids():
    import numpy as np

    from gaca_agent.learner.batch import PAD, identical_rows, with_kin
    from gaca_agent.steps import StepTable

    table = StepTable.from_tokens([[1, 2], [1, 2], [1, 2, 3], [1, 2], [1, 2]],
                                  [[5], [5], [5], [6], [5]], [[-1.0], [-2.0], [-1.0], [-1.0],
                                                              [-3.0]])
    kin = identical_rows(table, np.array([4, 0, 1, 2, 3]))
    # the same prompt and completion; a longer prompt or another answer is another row
    assert {k: v.tolist() for k, v in kin.items()} == {4: [4, 0, 1], 2: [2], 3: [3]}
    rows, index = with_kin(np.array([3, 4, PAD]), kin)
    assert rows.tolist() == [3, 4, 0, 1, PAD] and index.tolist() == [0, 1, 1, 1, 2]


def test_rows_of_the_same_ids_are_forwarded_once_and_the_update_is_unchanged(
        tiny_model_path, monkeypatch):
    """A group's episodes that act alike give rows of the same prompt and completion: the
    update forwards each such pair once (the recompute, the reference and the policy
    pass) and lets the loss see every row with its own advantage and importance weight,
    so the parameters move as when every row is forwarded on its own."""
    import numpy as np

    from gaca_agent.learner import core
    from gaca_agent.steps import StepTable

    seen = {}
    for name in ("once", "each"):
        if name == "each":
            monkeypatch.setattr(core, "identical_rows",
                                lambda table, rows: {int(i): np.asarray([i]) for i in rows})
        learner, tok = make_learner(tiny_model_path, micro_batch_size=2, mini_batch_rows=4,
                                    old_logprobs="recompute", tis_cap=1.2, log_entropy=True)
        base, adv = samples(tok, n=5)
        prompts = [base["prompt_ids"][i] for i in (0, 1, 2, 3, 4, 0, 0, 2)]
        comps = [base["completion_ids"][i] for i in (0, 1, 2, 3, 4, 0, 0, 2)]
        lps = [np.asarray(base["logprobs"][i]) - 0.3 * k
               for k, i in enumerate((0, 1, 2, 3, 4, 0, 0, 2))]  # own behaviour log-probs
        table = StepTable.from_tokens(prompts, comps, lps)
        advantages = np.array([0.9, -0.4, 0.5, 0.2, -0.7, -0.8, 0.3, 0.6])
        seen[name] = observed_update(learner, table, advantages)
    (n_once, g_once, p_once, m_once), (n_each, g_each, p_each, m_each) = seen["once"], seen["each"]
    n_once, n_each = sum(n_once), sum(n_each)
    # the recompute over all 8 rows: 5 distinct pairs; the reference and policy passes
    # over mini-batches [0-3] and [4-7]: 4 + 3 distinct pairs; against 8 rows three times
    assert (n_once, n_each) == (5 + 2 * (4 + 3), 3 * 8)
    assert m_once["train/shared_rows_frac"] == pytest.approx(1 / 8)
    assert m_each["train/shared_rows_frac"] == 0.0
    for key in ("train/tokens", "losses/policy", "losses/kl", "losses/clip_frac",
                "losses/entropy", "train/is_ratio_mean", "train/rollout_logprob_gap"):
        assert m_once[key] == pytest.approx(m_each[key], rel=1e-5, abs=1e-9), key
    assert set(g_once) == set(g_each)
    assert all(torch.allclose(g_once[k], g_each[k], rtol=1e-4, atol=1e-7) for k in g_each)
    assert max(float((p_once[k] - p_each[k]).abs().max()) for k in p_each) < 1e-4


def test_bf16_auto_is_bf16_only_on_a_cpu_that_multiplies_it_natively(tiny_model_path,
                                                                    monkeypatch):
    """``learner.bf16: auto`` (the cpu_lm configs'): fp32 on a CPU without AVX512-BF16 or
    AMX, where PyTorch's bf16 products are many times slower than fp32; bf16 with its
    rollout copy where the CPU has them. ``true`` stays bf16 anywhere, with a warning."""
    import warnings

    from gaca_agent.learner import precision

    for native in (False, True):
        monkeypatch.setattr(precision, "cpu_has_bf16", lambda native=native: native)
        learner, _ = make_learner(tiny_model_path, bf16="auto")
        assert learner.config.bf16 is native
        assert (learner.rollout_copy is not None) is native
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bf16 where it is native: nothing to warn of
        make_learner(tiny_model_path, bf16=True)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no bf16 matrix units .*learner.bf16=false"):
        learner, _ = make_learner(tiny_model_path, bf16=True)
    assert learner.config.bf16 is True and learner.rollout_copy is not None
    with pytest.raises(ValueError, match="bf16 must be true, false or auto"):
        make_learner(tiny_model_path, bf16="fast")


def test_lora_trains_only_the_adapter_and_uses_the_base_as_reference(tiny_model_path):
    pytest.importorskip("peft")
    learner, tok = make_learner(tiny_model_path, lora_r=4, lora_targets=("q_proj", "v_proj"))
    base = {k: v.detach().clone() for k, v in learner.unwrapped.named_parameters()
            if "lora" not in k}
    trainable = [k for k, v in learner.unwrapped.named_parameters() if v.requires_grad]
    assert trainable and all("lora" in k for k in trainable) and learner.ref_model is None
    learner.update(*samples(tok))
    learner.update(*samples(tok, seed=1))
    after = dict(learner.unwrapped.named_parameters())
    assert all(torch.equal(base[k], after[k]) for k in base)
    m = learner.update(*samples(tok, seed=2))
    assert m["losses/kl"] > 0  # the adapter moved the policy away from the base


def test_config_rejects_bad_values():
    from gaca_agent.learner.core import LearnerConfig

    with pytest.raises(ValueError, match="loss_agg"):
        LearnerConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="kl_kind"):
        LearnerConfig(kl_kind="k9")
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LearnerConfig(clip_ratio_c=0.5)
    with pytest.raises(ValueError, match="old_logprobs"):
        LearnerConfig(old_logprobs="fresh")


def test_memory_bounded_learner_logprobs_equal_the_full_computation(tiny_model_path):
    """The learner's chunked output layer (tiny chunks here) gives the log-probs and
    entropies of the plain full-vocabulary computation, and the same gradients."""
    from transformers import AutoModelForCausalLM

    from gaca_agent.learner.batch import pad_batch, sampled_rows, with_advantages
    from gaca_agent.learner.logprobs import forward_token_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    table, adv = samples(tok, n=5)
    data = with_advantages(table, adv)
    batch = pad_batch(data, sampled_rows(data), tok.pad_token_id, "cpu")
    logp, ent = forward_token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                       batch["positions"], batch["targets"], 0.7, True,
                                       chunk_tokens=3)
    (logp * batch["mask"]).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    idx = batch["positions"].unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    full = (logits.gather(1, idx) / 0.7).log_softmax(-1)
    ref = full.gather(-1, batch["targets"].unsqueeze(-1)).squeeze(-1)
    ref_ent = -(full.exp() * full).sum(-1)
    (ref * batch["mask"]).sum().backward()
    m = batch["mask"].bool()
    assert torch.allclose(logp[m], ref[m], atol=1e-5)
    # and each row equals an independent teacher-forced pass over its own tokens
    from conftest import full_logprobs

    for row, i in enumerate(sampled_rows(data)):
        exact = full_logprobs(model, table["prompt_ids"][i], table["completion_ids"][i], 0.7)
        n = len(exact)
        assert int(m[row].sum()) == n
        assert torch.allclose(logp[row][m[row]].double(), exact, atol=1e-5), row
    assert torch.allclose(ent[m], ref_ent[m], atol=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(grads[k], p.grad, rtol=1e-5, atol=1e-5), k


def test_bf16_keeps_fp32_masters_so_small_steps_are_not_lost(tiny_model_path):
    """lr 1e-6, three updates: with bf16 compute the weights move as in fp32 (the size of
    the change within 1%, its direction with cosine > 0.99), because parameters and Adam
    state stay fp32; on bf16 weights most of these steps round to nothing. (Element by
    element the runs differ by ~2%: Adam's first steps are sign-like, and bf16 gradients
    flip the sign of near-zero components.)"""
    def change(bf16):
        learner, tok = make_learner(tiny_model_path, lr=1e-6, bf16=bf16, kl_coef=0.0)
        assert all(p.dtype == torch.float32 for p in learner.unwrapped.parameters())
        before = params(learner.unwrapped)
        for seed in range(3):
            learner.update(*samples(tok, n=8, seed=seed))
        after = params(learner.unwrapped)
        return torch.cat([(after[k] - before[k]).flatten() for k in before])

    full, half = change(False), change(True)
    assert full.abs().max() > 0
    size = float(half.norm() / full.norm())
    cosine = float(torch.nn.functional.cosine_similarity(full, half, dim=0))
    assert abs(size - 1) < 0.01 and cosine > 0.99, (size, cosine)



def exact_table(learner, table, shift):
    """``table`` with rollout log-probs equal to the learner's own plus ``shift``."""
    from conftest import full_logprobs
    from gaca_agent.steps import StepTable

    exact = [full_logprobs(learner.unwrapped, table["prompt_ids"][i], table["completion_ids"][i])
             .numpy() + shift for i in range(len(table))]
    return StepTable.from_tokens(list(table["prompt_ids"]), list(table["completion_ids"]), exact)


def test_learner_applies_the_dual_clip(tiny_model_path):
    """Ratio 5 on every token with advantage -2: the dual clip c = 3 caps each token's
    loss at -c A = 6, every token counts as clipped, and nothing moves (no gradient)."""
    import math

    import numpy as np

    learner, tok = make_learner(tiny_model_path, clip_ratio_c=3.0, kl_coef=0.0)
    table, _ = samples(tok, n=4)
    table = exact_table(learner, table, -math.log(5.0))
    before = params(learner.unwrapped)
    metrics = learner.update(table, np.full(4, -2.0))
    assert metrics["losses/policy"] == pytest.approx(6.0, rel=1e-4)
    assert metrics["losses/clip_frac"] == 1.0
    after = params(learner.unwrapped)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_kl_penalty_pulls_the_policy_back_to_its_reference(tiny_model_path):
    """All advantages 0 and a reference moved away from the policy: the only gradient is
    the KL term's, so the logged KL falls update after update."""
    import numpy as np

    learner, tok = make_learner(tiny_model_path, kl_coef=1.0, lr=1e-3)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in learner.ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    table, _ = samples(tok)
    kls = [learner.update(table, np.zeros(len(table)))["losses/kl"] for _ in range(3)]
    assert kls[0] > 0 and kls[1] < kls[0] and kls[2] < kls[1], kls


@pytest.mark.parametrize("cap", [None, 1.2])
def test_truncated_importance_sampling(tiny_model_path, cap):
    """Rollout log-probs 0.5 below the learner's: the ratio pi_learner / pi_rollout is
    e^0.5 on every token (logged), and with tis_cap the policy gradient is scaled by
    min(e^0.5, cap)."""
    import math

    import numpy as np

    from conftest import full_logprobs
    from gaca_agent.steps import StepTable

    grads = {}
    for c in (None, cap):
        learner, tok = make_learner(tiny_model_path, kl_coef=0.0, old_logprobs="recompute",
                                    tis_cap=c, micro_batch_size=4)
        table, adv = samples(tok)
        model = learner.unwrapped
        exact = [full_logprobs(model, table["prompt_ids"][i], table["completion_ids"][i])
                 .numpy() - 0.5 for i in range(len(table))]
        table = StepTable.from_tokens(list(table["prompt_ids"]), list(table["completion_ids"]), exact)
        seen = capture_grads(learner)
        metrics = learner.update(table, np.asarray(adv))
        assert metrics["train/is_ratio_mean"] == pytest.approx(math.exp(0.5), rel=1e-3)
        assert metrics["train/is_ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-3)
        assert metrics["train/rollout_logprob_gap"] == pytest.approx(0.5, rel=1e-3)
        # recompute: the ratio is the learner's own (1), never the rollout's e^0.5
        assert metrics["losses/clip_frac"] == 0
        grads[c] = seen
    if cap is None:
        return
    scale = min(math.exp(0.5), cap)
    for name, g in grads[None].items():
        assert np.allclose(grads[cap][name].numpy(), scale * g.numpy(), rtol=1e-3, atol=1e-7)


def test_recomputed_old_logprobs_replace_the_rollouts(tiny_model_path):
    """old_logprobs: recompute: the ratio's denominator is the learner's own pass, so
    rollout log-probs 0.7 too low give exactly the update that exact ones give under
    ``rollout``; the logged gap is the 0.7, and a token the engine gave no log-prob for
    is left out of the ratio's statistics."""
    import math

    import numpy as np

    grads, metrics = {}, {}
    for mode, shift in (("rollout", 0.0), ("recompute", -0.7)):
        learner, tok = make_learner(tiny_model_path, kl_coef=0.0, old_logprobs=mode)
        table, adv = samples(tok)
        table = exact_table(learner, table, shift)
        if mode == "recompute":  # one token without a rollout log-prob
            table.ragged["logprobs"].values[0] = np.nan
        grads[mode] = capture_grads(learner)
        metrics[mode] = learner.update(table, adv)
    m = metrics["recompute"]
    assert m["train/rollout_logprob_gap"] == pytest.approx(0.7, rel=1e-3)
    assert m["train/is_ratio_mean"] == pytest.approx(math.exp(0.7), rel=1e-3)
    assert "train/rollout_logprob_gap" not in metrics["rollout"]
    assert grads["rollout"] and set(grads["rollout"]) == set(grads["recompute"])
    for name, g in grads["rollout"].items():
        assert torch.allclose(grads["recompute"][name], g, rtol=1e-4, atol=1e-7), name


def test_the_entropy_bonus_raises_entropy_and_logging_it_changes_nothing(tiny_model_path):
    """Advantages 0 and no KL: the entropy bonus is the only gradient, so the logged
    entropy rises update after update. ``log_entropy`` alone logs it and moves nothing."""
    import numpy as np

    learner, tok = make_learner(tiny_model_path, kl_coef=0.0, entropy_coef=1.0, lr=1e-3)
    table, _ = samples(tok)
    zeros = np.zeros(len(table))
    ents = [learner.update(table, zeros)["losses/entropy"] for _ in range(3)]
    assert ents[0] < ents[1] < ents[2], ents
    quiet, _ = make_learner(tiny_model_path, kl_coef=0.0, log_entropy=True)
    before = params(quiet.unwrapped)
    logged = quiet.update(table, zeros)["losses/entropy"]
    assert logged == pytest.approx(ents[0], rel=1e-5)
    after = params(quiet.unwrapped)
    assert all(torch.equal(before[k], after[k]) for k in before)
    plain, _ = make_learner(tiny_model_path, kl_coef=0.0)
    assert "losses/entropy" not in plain.update(table, zeros)


def test_the_learner_recomputes_at_the_temperature_the_rollouts_sampled(tiny_model_path):
    """gaca-train's config gives the learner model.temperature (0.7 here): rollouts the
    engine samples at 0.7 are recomputed by the update to rounding, where a learner at
    temperature 1 would score another distribution (a gap of hundredths, ratios far
    from 1); a learner.temperature other than the rollouts' is refused."""
    import numpy as np

    from gaca_agent.config import load_config
    from gaca_agent.generate.engines import HFEngine, Request
    from gaca_agent.learner.core import Learner
    from gaca_agent.steps import StepTable
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    cfg = load_config(None, ["model.temperature=0.7", "learner.old_logprobs=recompute",
                             "learner.kl_coef=0.0", "learner.lr=0.01"])
    assert cfg.learner.temperature == 0.7
    with pytest.raises(ValueError, match="learner.temperature 1 is not model.temperature 0.7"):
        load_config(None, ["model.temperature=0.7", "learner.temperature=1.0"])
    assert load_config(None, ["model.temperature=0.7", "learner.temperature=0.7"]) \
        .learner.temperature == 0.7
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    learner = Learner(tiny_model_path, tok, cfg.learner, Accelerator(cpu=True))
    prompts = [tok(f"Corridor, segment {i} of 12.")["input_ids"] for i in range(4)]
    out = HFEngine(learner.unwrapped, tok, "cpu").generate(
        [Request(tuple(p), 8, 0.7, key=i) for i, p in enumerate(prompts)])
    table = StepTable.from_tokens(prompts, [c.completion_ids for c in out],
                                  [c.logprobs for c in out])
    metrics = learner.update(table, np.asarray([1.0, -1.0, 0.5, -0.5]))
    assert metrics["train/rollout_logprob_gap"] < 1e-5
    assert metrics["train/is_ratio_max"] == pytest.approx(1.0, abs=1e-4)


def test_bf16_on_a_cpu_rolls_out_on_a_fresh_bf16_copy_within_the_tolerance(tiny_model_path):
    """learner.bf16 on a CPU: masters stay fp32, rollouts generate with a bf16 copy that
    each rollout context refreshes from them, and the rollout's log-probs match both the
    bf16 learner's recomputation and an fp32 pass within 0.05 nats a token on average
    (docs/benchmarks.md: SmolLM2-135M measured 0.04), also after an update."""
    import numpy as np

    from gaca_agent.generate.engines import HFEngine, Request
    from gaca_agent.steps import StepTable

    learner, tok = make_learner(tiny_model_path, bf16=True, kl_coef=0.0, lr=0.05,
                                old_logprobs="recompute")
    fp32, _ = make_learner(tiny_model_path, kl_coef=0.0)
    assert learner.rollout_model.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in learner.unwrapped.parameters())
    prompts = [tok(f"Corridor, segment {i} of 12.")["input_ids"] for i in range(4)]

    def roll():
        with learner.rollout_context():
            out = HFEngine(learner.rollout_model, tok, "cpu").generate(
                [Request(tuple(p), 8, 1.0, key=i) for i, p in enumerate(prompts)])
        return StepTable.from_tokens(prompts, [c.completion_ids for c in out],
                                     [c.logprobs for c in out]), out

    def gap(scorer, out):
        return np.mean(np.concatenate([
            np.abs(np.asarray(c.logprobs) - scorer.score(p, c.completion_ids))
            for p, c in zip(prompts, out)]))

    table, out = roll()
    assert gap(learner, out) < 0.05 and gap(fp32, out) < 0.05
    for _ in range(3):  # the weights move well past bf16's rounding
        learner.update(table, np.asarray([1.0, -1.0, 1.0, -1.0]))
    table, out = roll()  # a stale copy would sample from the old weights
    assert gap(learner, out) < 0.05
    metrics = learner.update(table, np.asarray([1.0, -1.0, 1.0, -1.0]))
    assert metrics["train/rollout_logprob_gap"] < 0.05
