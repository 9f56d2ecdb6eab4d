"""Diagnostic text MDPs with exact values (``gaca/Diag-*-v0``)."""

from gaca_envs.diag.mdp import (Outcome, Step, TabularMDP, Values, exact_values, optimal_policy,
                                simulate, softmax_policy, uniform_policy)

__all__ = ["Outcome", "Step", "TabularMDP", "Values", "exact_values", "optimal_policy",
           "simulate", "softmax_policy", "uniform_policy"]
