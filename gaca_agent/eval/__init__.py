"""Evaluating a policy: ``gaca-eval``'s plan, resumable episode files and results, and the
suites (several envs or splits in one command)."""
