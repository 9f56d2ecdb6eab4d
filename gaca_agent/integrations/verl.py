"""gaca's estimators in verl's advantage-estimator registry.

``import gaca_agent.integrations.verl`` registers every estimator with
``verl.trainer.ppo.core_algos.register_adv_est`` as ``gaca_<name>`` (``gaca_gigpo``,
``gaca_grpo``, ...) and GACA also as ``gaca``, so ``algorithm.adv_estimator=gaca`` selects
it. verl calls the function with its batch fields and it returns ``(advantages, returns)``
of shape ``(bs, response_length)``, the step's advantage on each response token.

The rows are read as verl-agent lays them out: one row per step, the rows of a trajectory
in step order; ``index`` (``uid``) is the task group; ``traj_index`` (``traj_uid``), the
per-step env rewards (``rewards``) and the anchor states (``anchor_obs``) come as keyword
arguments or in ``non_tensor_batch``; GACA's per-step NLL is the masked token mean of
``-old_log_probs``. Without ``traj_uid`` each row is a one-step episode (stock verl's
single-turn rows); without per-step rewards a row's reward is its ``token_level_rewards``
sum; without ``anchor_obs`` a row's anchor is its group (the prompt).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from gaca_agent.advantages import StepBatch, compute, names


#: What some estimators read beyond rewards and groups, and the verl field it comes from:
#: the step NLL (GACA's weight; EMPG's entropy falls back to it) and the action (AdaStep).
NEEDS = {"gaca": "old_log_probs", "empg": "old_log_probs", "adastep": "responses"}


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def step_batch(token_level_rewards, response_mask, index, *, traj_index=None,
               anchor_obs=None, rewards=None, old_log_probs=None,
               responses=None) -> StepBatch:
    """The :class:`StepBatch` of verl-shaped fields (one row per step). A row's action
    is its response's tokens (``responses``, under the mask); its entropy, its NLL."""
    mask = _np(response_mask).astype(np.float64)
    n = mask.shape[0]
    group = _np(index) if index is not None else np.zeros(n, dtype=np.int64)
    traj = _np(traj_index) if traj_index is not None else np.arange(n)
    _, traj_codes = np.unique(traj, return_inverse=True)
    state = np.asarray(anchor_obs, dtype=object) if anchor_obs is not None else group
    # rows of a trajectory come in step order: count them, and link each to the next
    t = np.zeros(n, dtype=np.int64)
    following: dict[int, int] = {}
    last_row: dict[int, int] = {}
    for i, code in enumerate(traj_codes.tolist()):
        if code in last_row:
            t[i] = t[last_row[code]] + 1
            following[last_row[code]] = i
        last_row[code] = i
    terminal = np.zeros(n, dtype=bool)
    terminal[list(last_row.values())] = True
    next_state = np.array([state[following[i]] if i in following else "<end>"
                           for i in range(n)], dtype=object)
    reward = (_np(rewards).astype(np.float64) if rewards is not None
              else _np(token_level_rewards).astype(np.float64).sum(-1))
    nll = None
    if old_log_probs is not None:
        lp = _np(old_log_probs).astype(np.float64)
        nll = -(lp * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0)
    action = None
    if responses is not None:
        tokens = _np(responses)
        action = np.array([hash(tuple(tokens[i][mask[i] > 0].tolist())) for i in range(n)],
                          dtype=np.int64)
    return StepBatch(group=group, traj=traj_codes, t=t, reward=reward, state=state,
                     next_state=next_state, action=action, nll=nll, terminal=terminal,
                     entropy=nll)


def estimator(name: str, **params: Any) -> Callable[..., tuple]:
    """verl's estimator signature around gaca estimator ``name`` with ``params`` (the
    estimator's own options, e.g. ``gamma``, ``kappa``)."""

    def fn(token_level_rewards, response_mask, index=None, config=None, *,
           non_tensor_batch=None, batch=None, traj_index=None, anchor_obs=None,
           rewards=None, old_log_probs=None, responses=None, **_ignored):
        import torch

        extra = dict(non_tensor_batch or {})
        present = set(batch.keys()) if batch is not None else set()
        if old_log_probs is None and "old_log_probs" in present:
            old_log_probs = batch["old_log_probs"]
        if responses is None and "responses" in present:
            responses = batch["responses"]
        rows = step_batch(
            token_level_rewards, response_mask, index if index is not None else extra.get("uid"),
            traj_index=traj_index if traj_index is not None else extra.get("traj_uid"),
            anchor_obs=anchor_obs if anchor_obs is not None else extra.get("anchor_obs"),
            rewards=rewards if rewards is not None else extra.get("rewards"),
            old_log_probs=old_log_probs, responses=responses)
        needed = NEEDS.get(name)
        if needed and getattr(rows, "nll" if needed == "old_log_probs" else "action") is None:
            raise ValueError(
                f"gaca_{name} needs the batch's {needed}: pass {needed}= or a batch= holding "
                "it; verl's own compute_advantage passes neither to a registered estimator")
        adv, _ = compute(name, rows, **params)
        mask = response_mask.to(torch.float32)
        out = torch.as_tensor(adv, dtype=torch.float32, device=mask.device)[:, None] * mask
        return out, out.clone()

    fn.__name__ = f"gaca_{name}"
    fn.__doc__ = f"gaca's {name!r} estimator with verl's signature (params: {params})."
    return fn


def register(params: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Register every estimator with verl (``gaca_<name>``, and ``gaca``); ``params``
    maps an estimator name to its options. Returns the registered names. Registering
    again replaces gaca's own entries."""
    from verl.trainer.ppo import core_algos

    params = params or {}
    done = []
    for name in names():
        fn = estimator(name, **params.get(name, {}))
        for key in ([f"gaca_{name}", "gaca"] if name == "gaca" else [f"gaca_{name}"]):
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(key, None)  # ours only: gaca_* names
            core_algos.register_adv_est(key)(fn)
            done.append(key)
    return done


register()
