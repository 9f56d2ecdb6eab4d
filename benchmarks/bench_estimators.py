"""Time per estimator call on synthetic batches; GiGPO/GACA against a per-row loop.

Batches: N trajectories x 50 steps in groups of 8, ALFWorld-like (sparse terminal reward,
states revisited). The per-row baseline is a plain-Python GiGPO written for this
benchmark in the style of verl-agent's ``core_gigpo`` (per-trajectory loops, a
``np.where`` per row to place each return, dict-based anchor groups); results are checked
equal to 1e-5.

    python benchmarks/bench_estimators.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

from gaca_agent.advantages import StepBatch, compute, names, prepare


def synthetic_batch(n_traj: int, steps: int = 50, group_size: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = n_traj * steps
    traj = np.repeat(np.arange(n_traj), steps)
    t = np.tile(np.arange(steps), n_traj)
    group = traj // group_size
    state = rng.integers(0, 30, size=n) + 1000 * group  # revisits inside a group
    next_state = np.roll(state, -1)
    success = rng.random(n_traj) < 0.4
    reward = np.where((t == steps - 1) & success[traj], 10.0, 0.0) - 0.1 * (rng.random(n) < 0.05)
    return StepBatch(group=group, traj=traj, t=t, reward=reward, state=state,
                     next_state=next_state, action=rng.integers(0, 5, size=n),
                     nll=rng.gamma(2.0, 0.5, size=n), terminal=(t == steps - 1) & success[traj],
                     entropy=rng.random(n))


def rowloop_gigpo(b: StepBatch, gamma=0.95, omega=1.0, eps=1e-6):
    """Per-row Python loops (the baseline the issue compares against)."""
    traj, t, reward = np.asarray(b.traj), np.asarray(b.t), np.asarray(b.reward, float)
    group, state = np.asarray(b.group), np.asarray(b.state)
    returns_by_traj = {}
    for uid in np.unique(traj):
        idx = np.where(traj == uid)[0]
        idx = idx[np.argsort(t[idx])]
        running, out = 0.0, np.zeros(len(idx))
        for k in reversed(range(len(idx))):
            running = reward[idx[k]] + gamma * running
            out[k] = running
        returns_by_traj[uid] = (idx, out)
    G = np.zeros(len(traj))
    for i, uid in enumerate(traj):
        idx, out = returns_by_traj[uid]
        G[i] = out[np.where(idx == i)[0][0]]
    R = {uid: reward[idx].sum() for uid, (idx, _) in returns_by_traj.items()}
    by_group = defaultdict(list)
    for uid in R:
        by_group[group[returns_by_traj[uid][0][0]]].append(R[uid])
    a_e = np.zeros(len(traj))
    for i in range(len(traj)):
        vals = by_group[group[i]]
        a_e[i] = 0.0 if len(vals) < 2 else (R[traj[i]] - np.mean(vals)) / (np.std(vals, ddof=1) + eps)
    anchors = defaultdict(list)
    for i in range(len(traj)):
        anchors[(group[i], state[i])].append(i)
    a_s = np.zeros(len(traj))
    for members in anchors.values():
        if len(members) < 2:
            continue
        vals = G[members]
        mu, sd = vals.mean(), vals.std(ddof=1)
        for i in members:
            a_s[i] = (G[i] - mu) / (sd + eps)
    return a_e + omega * a_s


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    sizes = (128, 1024)
    batches = {n: synthetic_batch(n) for n in sizes}
    print(f"| estimator | {' | '.join(f'{n} x 50 ({n * 50} rows)' for n in sizes)} |")
    print("|---|" + "---|" * len(sizes))
    for name in names():
        cells = [f"{1e3 * timed(lambda: compute(name, batches[n]), args.repeats):.2f} ms"
                 for n in sizes]
        print(f"| {name} | {' | '.join(cells)} |")
    b = batches[128]
    fast = compute("gigpo", b)[0]
    slow = rowloop_gigpo(b)
    assert np.allclose(fast, slow, atol=1e-5), np.abs(fast - slow).max()
    t_fast = timed(lambda: compute("gigpo", b), args.repeats)
    t_gaca = timed(lambda: compute("gaca", b), args.repeats)
    t_slow = timed(lambda: rowloop_gigpo(b), max(3, args.repeats // 5))
    t_prep = timed(lambda: prepare(b), args.repeats)
    print(f"\n6,400 rows: per-row loop GiGPO {1e3 * t_slow:.1f} ms; vectorised GiGPO "
          f"{1e3 * t_fast:.2f} ms ({t_slow / t_fast:.0f}x), GACA {1e3 * t_gaca:.2f} ms "
          f"({t_slow / t_gaca:.0f}x); of which batch validation {1e3 * t_prep:.2f} ms; "
          f"max |difference| {np.abs(fast - slow).max():.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
