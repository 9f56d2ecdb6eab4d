"""Diagnostic text MDPs with exact values (``gaca/Diag-*-v0``)."""

from gaca_envs.diag.mdp import (Outcome, TabularMDP, Values, exact_values, optimal_policy,
                                softmax_policy, uniform_policy)

__all__ = ["Outcome", "TabularMDP", "Values", "exact_values", "optimal_policy",
           "softmax_policy", "uniform_policy"]
