"""Loss maths and the learner: gradients, accumulation, masking, KL, LoRA."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from gaca_agent.losses import aggregate, kl_penalty, ppo_clip_loss  # noqa: E402


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
    import random

    from gaca_agent.learner import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = tokenizer(f"Corridor, segment {i} of 12. " * (1 + i % 3))["input_ids"]
        c = tokenizer("<think>go</think><action>walk forward</action>")["input_ids"][: 3 + i % 4]
        out.append(Sample(p, c, [-rng.uniform(0.5, 3.0) for _ in c], rng.uniform(-1, 1)))
    return out


def make_learner(path, **kw):
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from gaca_agent.learner import Learner, LearnerConfig

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path)
    cfg = LearnerConfig(**{"lr": 1e-2, "kl_coef": 0.05, **kw})
    return Learner(path, tok, cfg, Accelerator(cpu=True)), tok


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
    metrics = learner.update(samples(tok))
    after = params(learner.unwrapped)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["train/tokens"] == sum(len(s.completion_ids) for s in samples(tok))
    assert metrics["losses/kl"] >= 0 and 0 <= metrics["losses/clip_frac"] <= 1


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_accumulate_to_the_same_update(tiny_model_path, agg):
    a, tok = make_learner(tiny_model_path, micro_batch_size=1, loss_agg=agg)
    b, _ = make_learner(tiny_model_path, micro_batch_size=4, loss_agg=agg)
    batch = samples(tok, n=4)
    grads = [capture_grads(a), capture_grads(b)]
    a.update(batch)
    b.update(batch)
    ga, gb = grads
    assert ga and set(ga) == set(gb)
    # the accumulated gradient is the same (Adam's first step, ~lr * sign(g), would
    # amplify rounding in near-zero components, so gradients are compared, then params)
    assert all(torch.allclose(ga[k], gb[k], rtol=1e-4, atol=1e-7) for k in ga)
    pa, pb = params(a.unwrapped), params(b.unwrapped)
    close = sum(torch.allclose(pa[k], pb[k], atol=1e-5) for k in pa)
    assert close >= len(pa) - 1


def test_lora_trains_only_the_adapter_and_uses_the_base_as_reference(tiny_model_path):
    pytest.importorskip("peft")
    learner, tok = make_learner(tiny_model_path, lora_r=4, lora_targets=("q_proj", "v_proj"))
    base = {k: v.detach().clone() for k, v in learner.unwrapped.named_parameters()
            if "lora" not in k}
    trainable = [k for k, v in learner.unwrapped.named_parameters() if v.requires_grad]
    assert trainable and all("lora" in k for k in trainable) and learner.ref_model is None
    learner.update(samples(tok))
    learner.update(samples(tok, seed=1))
    after = dict(learner.unwrapped.named_parameters())
    assert all(torch.equal(base[k], after[k]) for k in base)
    m = learner.update(samples(tok, seed=2))
    assert m["losses/kl"] > 0  # the adapter moved the policy away from the base


def test_config_rejects_bad_values():
    from gaca_agent.learner import LearnerConfig

    with pytest.raises(ValueError, match="loss_agg"):
        LearnerConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="kl_kind"):
        LearnerConfig(kl_kind="k9")
