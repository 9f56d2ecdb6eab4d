"""GACA's risk decomposition adds up to its measured error on every diagnostic world."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from gaca_agent.analysis.risk import alignment, decompose, mixture, parts
from gaca_envs.diag.worlds import WORLDS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def batch_of(world: str, seed: int):
    from bench_credit import sample_batch

    return sample_batch(world, "aligned", 1.0, np.random.default_rng(seed))


@pytest.mark.parametrize("world", sorted(WORLDS))
@pytest.mark.parametrize("form", ["linear", "sigmoid", "convex"])
def test_the_terms_add_up_to_the_measured_error(world, form):
    for seed in range(3):
        batch, exact = batch_of(world, seed)
        a, a_e, a_s, mix, eligible = parts(batch, form=form, kappa=1.0)
        a0, d, u = mixture(a_e, a_s, mix, form, eligible=eligible)
        assert np.allclose(a0 + d * u, a, atol=1e-12)  # the form is this mixture
        t = decompose(a0, d, u, exact)
        assert t["fixed"] + t["alignment"] + t["energy"] == pytest.approx(t["measured"],
                                                                          abs=1e-9)
        assert t["measured"] == pytest.approx(float(np.mean((a - exact) ** 2)), abs=1e-12)
        assert t["energy"] > 0  # the modulation is not the identity on these batches
        # kappa = 0: the fixed mixture alone (GiGPO for linear and sigmoid)
        a_0 = parts(batch, form=form, kappa=0.0)[0]
        assert np.allclose(a_0, a0, atol=1e-12)


@pytest.mark.parametrize("world", sorted(WORLDS))
def test_alignment_is_minus_the_slope_of_the_error_in_kappa_at_zero(world):
    """Linear form: d(error)/d(kappa) at 0 = 2 omega mean(z u e0) = -2 alignment."""
    from gaca_agent.advantages.gaca import criticality

    batch, exact = batch_of(world, 0)
    a, a_e, a_s, _, eligible = parts(batch, form="linear", kappa=0.0)
    z = criticality(batch.nll.astype(float), batch.traj, eligible)
    h = 1e-6
    err = [np.mean((parts(batch, form="linear", kappa=k)[0] - exact) ** 2) for k in (0.0, h)]
    slope = (err[1] - err[0]) / h
    assert slope == pytest.approx(-2 * alignment(z, a_s, a - exact), rel=1e-3, abs=1e-9)
