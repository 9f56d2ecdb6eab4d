"""The server probe: does the inference server sample from the distribution the learner
trains on?

One fixed prompt is sampled by the server (a fixed seed, the run's temperature) and the
completion's tokens are scored by the learner at the same temperature. The gap is the
mean absolute difference of the per-token log-probs. Kernels differ (bf16 on a GPU gives
gaps of a few hundredths); a server that applies other sampling parameters (top-k, a
repetition penalty), reports log-probs before the temperature (vLLM's default
``--logprobs-mode raw_logprobs``) or serves other weights gives far larger ones. The run
refuses to train beyond ``server.probe_tolerance`` and names the flag to fix; it probes
at start-up and after every weight sync.

The same request is sent twice: different tokens mean the server ignores ``seed``
(SGLang without ``--enable-deterministic-inference``); rollouts are then not reproducible
from the run's seed, which the run logs (``probe/seed_honoured``) and warns about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

PROBE_MESSAGES = (
    {"role": "system", "content": "You are an agent in a text world."},
    {"role": "user", "content": "You are in a corridor. Exits: north, east. Your task: "
                                "reach the exit. Think, then answer with one action."},
)
PROBE_KEY = 20_261_201

Scorer = Callable[[Sequence[int], Sequence[int], float], np.ndarray]
"""(prompt ids, completion ids, temperature) -> the learner's per-token log-probs."""


class ProbeMismatch(RuntimeError):
    """The server's log-probs disagree with the learner's beyond the tolerance."""


@dataclass(frozen=True)
class ProbeResult:
    temperature: float
    learner_temperature: float
    """The temperature the learner scored at (the one its update recomputes at)."""
    tokens: int
    mean_gap: float
    max_gap: float
    raw_gap: float | None
    """Mean gap to the learner's temperature-1 log-probs (None at temperature 1)."""
    seed_honoured: bool

    def metrics(self, prefix: str = "probe") -> dict[str, float]:
        return {f"{prefix}/mean_gap": self.mean_gap, f"{prefix}/max_gap": self.max_gap,
                f"{prefix}/tokens": float(self.tokens),
                f"{prefix}/seed_honoured": float(self.seed_honoured)}


def probe(engine, score: Scorer, temperature: float, tokens: int = 16,
          learner_temperature: float | None = None) -> ProbeResult:
    """Sample the probe prompt on ``engine`` (a :class:`ServerEngine`) at ``temperature``
    and compare with the learner's log-probs at ``learner_temperature`` (default: the
    same): the rollout probe passes the temperature the update recomputes at, so a
    learner scoring another distribution than the one sampled shows as a gap."""
    scored_at = temperature if learner_temperature is None else learner_temperature
    messages = [dict(m) for m in PROBE_MESSAGES]
    first = engine.complete(messages, tokens, temperature, key=PROBE_KEY)
    again = engine.complete(messages, tokens, temperature, key=PROBE_KEY)
    served = np.asarray(first.logprobs, dtype=np.float64)
    mine = np.asarray(score(first.prompt_ids, first.completion_ids, scored_at),
                      dtype=np.float64)
    gap = np.abs(served - mine)
    raw = None
    if abs(temperature - 1.0) > 1e-6:
        at_one = np.asarray(score(first.prompt_ids, first.completion_ids, 1.0),
                            dtype=np.float64)
        raw = float(np.abs(served - at_one).mean())
    return ProbeResult(float(temperature), float(scored_at), len(served), float(gap.mean()),
                       float(gap.max()), raw, first.completion_ids == again.completion_ids)


def check(result: ProbeResult, tolerance: float, kind: str) -> None:
    """Raise :class:`ProbeMismatch` when the gap exceeds ``tolerance``, saying what the
    measured gaps point to and which server flag fixes it."""
    if result.mean_gap <= tolerance:
        return
    head = (f"the inference server's log-probs differ from the learner's by "
            f"{result.mean_gap:.4f} a token on average (max {result.max_gap:.4f}; "
            f"{result.tokens} tokens at temperature {result.temperature:g}; "
            f"server.probe_tolerance {tolerance:g}): its rollouts do not come from the "
            "policy being trained.")
    if abs(result.learner_temperature - result.temperature) > 1e-6:
        raise ProbeMismatch(f"{head} The learner recomputes log-probs at temperature "
                            f"{result.learner_temperature:g}, not at the rollouts' "
                            f"{result.temperature:g}: one temperature for both "
                            "(model.temperature; leave learner.temperature unset).")
    if result.raw_gap is not None and result.raw_gap < result.mean_gap / 2:
        cause = ("They match the learner's at temperature 1: the server reports log-probs "
                 "before the temperature. " +
                 ("Start vLLM with --logprobs-mode processed_logprobs." if kind == "vllm"
                  else "Unset SGLANG_RETURN_ORIGINAL_LOGPROB on the SGLang server."))
    elif kind == "vllm":
        cause = ("Start vLLM with --logprobs-mode processed_logprobs (so that it reports "
                 "the distribution it samples from) and --generation-config vllm (no "
                 "sampling defaults from the model's generation_config.json), and check "
                 "that the server serves the weights this run synced (server.model the "
                 "same weights as model.path; bf16 on both sides).")
    else:
        cause = ("Start SGLang with --sampling-defaults openai (no sampling defaults from "
                 "the model's generation_config.json) and check that the server serves "
                 "the weights this run synced (server.model the same weights as "
                 "model.path).")
    raise ProbeMismatch(f"{head} {cause}")
