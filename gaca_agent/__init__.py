"""Policies, rollout collection, credit-assignment estimators and the learner."""

__version__ = "0.1.0"
