"""Turning turns into sampled completions: prompts and templates, the rollout engines
(``hf``, ``paged``, ``server``) with exact per-token log-probs, keyed sampling, span NLLs
and the server probe."""
