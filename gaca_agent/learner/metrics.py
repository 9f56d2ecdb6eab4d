"""An update's metrics from the sums every rank reduced (a pure function of them)."""

from __future__ import annotations

#: What each rank sums while it updates (reduced across ranks, then divided here).
SUM_KEYS = ("policy", "kl", "clip", "entropy", "tokens", "opt_steps", "grad_norm", "skipped",
            "rows", "shared")


def update_metrics(s: dict[str, float], cfg, lr: float, ratio_max: float) -> dict[str, float]:
    """``s``: the reduced :data:`SUM_KEYS` and, with ``old_logprobs: recompute``, ``gap``,
    ``ratio_sum``, ``ratio_n``, ``truncated`` and ``masked``; ``cfg`` the learner's config;
    ``ratio_max`` the largest importance ratio of any rank."""
    tokens = max(s["tokens"], 1.0)
    out = {"losses/policy": s["policy"] / max(s["opt_steps"], 1.0),
           "losses/kl": s["kl"] / tokens, "losses/clip_frac": s["clip"] / tokens,
           "losses/grad_norm": s["grad_norm"] / max(s["opt_steps"], 1.0),
           "train/tokens": s["tokens"], "train/opt_steps": s["opt_steps"],
           # rows with advantage 0 and no other loss term: not forwarded (no gradient)
           "train/skipped_rows_frac": s["skipped"] / max(s["rows"], 1.0),
           # rows whose token ids another row had: forwarded once for all of them
           "train/shared_rows_frac": s["shared"] / max(s["rows"], 1.0),
           "train/lr": lr}
    if cfg.entropy_coef > 0 or cfg.log_entropy:
        out["losses/entropy"] = s["entropy"] / tokens
    if cfg.old_logprobs == "recompute" and s["ratio_n"] > 0:
        # mean |recomputed - sampled| log-prob over the tokens the engine gave one for
        # (of the rows trained on): the rollout/learner mismatch
        out["train/rollout_logprob_gap"] = s["gap"] / max(s["ratio_n"], 1.0)
        # pi_learner_old / pi_rollout per token (before truncation or masking)
        out["train/is_ratio_mean"] = s["ratio_sum"] / max(s["ratio_n"], 1.0)
        out["train/is_ratio_max"] = ratio_max
        if cfg.correction.weighted:
            out["train/is_truncated_frac"] = s["truncated"] / max(s["ratio_n"], 1.0)
            out["train/is_masked_frac"] = s["masked"] / max(s["ratio_n"], 1.0)
    return out
