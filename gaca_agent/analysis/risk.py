"""GACA's error to the exact advantage, split into terms a batch gives (docs/algorithms.md,
"GACA's risk, term by term").

Every form of GACA is a fixed mixture plus a per-step modulation along one direction:
A_t = A0_t + d_t u_t, with

- ``linear`` / ``sigmoid``: A0 = A^E + omega A^S (GiGPO), u = A^S, d = w_t - omega;
- ``convex``: A0 = A^E + lam0 (A^S - A^E) with lam0 = lambda_bar on rows whose anchor
  group has two or more members and 0 on singletons (GACA at kappa = 0), u = A^S - A^E,
  d = lam_t - lam0.

With e0 = A0 - A* the fixed mixture's error, the mean squared error is exactly

    mean((A - A*)^2) = mean(e0^2) + 2 mean(d u e0) + mean(d^2 u^2)
                       fixed risk   alignment      modulation energy

so modulation lowers the error exactly when the alignment term is negative and larger
than the energy. For ``linear`` with no clipping, d = omega kappa z_t, so the slope of the
error in kappa at kappa = 0 is 2 omega mean(z u e0); :func:`alignment` returns its
negative, ``-mean(z u e0)`` (positive: a small kappa lowers the error).
"""

from __future__ import annotations

import numpy as np


def decompose(a0: np.ndarray, d: np.ndarray, u: np.ndarray, exact: np.ndarray
              ) -> dict[str, float]:
    """The three terms of mean((a0 + d u - exact)^2), and that error measured directly."""
    a0, d, u, exact = (np.asarray(x, dtype=np.float64) for x in (a0, d, u, exact))
    e0 = a0 - exact
    terms = {"fixed": float(np.mean(e0 ** 2)), "alignment": float(2 * np.mean(d * u * e0)),
             "energy": float(np.mean((d * u) ** 2))}
    terms["measured"] = float(np.mean((a0 + d * u - exact) ** 2))
    return terms


def mixture(a_e: np.ndarray, a_s: np.ndarray, mix: np.ndarray, form: str, *, omega: float = 1.0,
            lambda_bar: float = 0.5, eligible: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A0, d, u) of a GACA form from its parts: ``mix`` is the weight w_t (``linear``,
    ``sigmoid``) or the coefficient lam_t (``convex``, where ``eligible`` marks rows of
    anchor groups of two or more)."""
    a_e, a_s, mix = (np.asarray(x, dtype=np.float64) for x in (a_e, a_s, mix))
    if form in ("linear", "sigmoid"):
        return a_e + omega * a_s, mix - omega, a_s
    if form != "convex":
        raise ValueError(f"form must be linear, sigmoid or convex, got {form!r}")
    if eligible is None:
        raise ValueError("the convex form needs `eligible` (rows of anchor groups of 2+)")
    lam0 = np.where(np.asarray(eligible, dtype=bool), lambda_bar, 0.0)
    return a_e + lam0 * (a_s - a_e), mix - lam0, a_s - a_e


def alignment(z: np.ndarray, u: np.ndarray, e0: np.ndarray) -> float:
    """-mean(z u e0): positive when a small kappa lowers the linear form's error."""
    return float(-np.mean(np.asarray(z) * np.asarray(u) * np.asarray(e0)))


def parts(batch, norm: str = "mean", **gaca_params):
    """GACA's advantage on ``batch`` and its parts: (A, A^E, A^S, w_t or lam_t, rows of
    anchor groups of two or more). A^E is GiGPO's at omega = 0."""
    from gaca_agent.advantages import compute

    a, _, rows = compute("gaca", batch, details=True, norm=norm, **gaca_params)
    a_e = compute("gigpo", batch, omega=0.0, norm=norm)[0]
    _, idx, counts = np.unique(np.stack([batch.group, batch.state]), axis=1,
                               return_inverse=True, return_counts=True)
    return a, a_e, rows["step_adv"], rows["weight"], counts[idx.ravel()] >= 2
