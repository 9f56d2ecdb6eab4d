"""Reference estimators written as plain loops straight from docs/algorithms.md.

Slow and obvious on purpose: the vectorised estimators must equal these. Rows are dicts
with the StepBatch fields; every function returns one advantage per row, in row order.
"""

from __future__ import annotations

import math
from collections import defaultdict

EPS = 1e-6


def mean(xs):
    return sum(xs) / len(xs)


def sample_std(xs):
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def pop_std(xs):
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def normalise(x, members, norm):
    if len(members) < 2:
        return 0.0
    centred = x - mean(members)
    return centred / (sample_std(members) + EPS) if norm == "std" else centred


def episode_returns(rows):
    R = defaultdict(float)
    for r in rows:
        R[r["traj"]] += r["reward"]
    return R


def returns_to_go(rows, gamma):
    by_traj = defaultdict(dict)
    for i, r in enumerate(rows):
        by_traj[r["traj"]][r["t"]] = i
    G = [0.0] * len(rows)
    for steps in by_traj.values():
        acc = 0.0
        for t in sorted(steps, reverse=True):
            acc = rows[steps[t]]["reward"] + gamma * acc
            G[steps[t]] = acc
    return G


def grpo(rows, norm="std", episode_stats="trajectories"):
    R = episode_returns(rows)
    out = []
    for r in rows:
        if episode_stats == "trajectories":
            members = [R[tr] for tr in {x["traj"] for x in rows if x["group"] == r["group"]}]
        else:
            members = [R[x["traj"]] for x in rows if x["group"] == r["group"]]
        out.append(normalise(R[r["traj"]], members, norm))
    return out


def rloo(rows):
    R = episode_returns(rows)
    out = []
    for r in rows:
        others = [R[tr] for tr in {x["traj"] for x in rows if x["group"] == r["group"]}
                  if tr != r["traj"]]
        out.append(R[r["traj"]] - mean(others) if others else 0.0)
    return out


def reinforce_pp(rows):
    R = episode_returns(rows)
    group_of = {r["traj"]: r["group"] for r in rows}
    centred = {}
    for tr, g in group_of.items():
        centred[tr] = R[tr] - mean([R[u] for u, h in group_of.items() if h == g])
    scale = sample_std(list(centred.values()))
    return [centred[r["traj"]] / (scale + EPS) for r in rows]


def step_adv(rows, gamma, norm):
    G = returns_to_go(rows, gamma)
    out, sizes = [], []
    for i, r in enumerate(rows):
        members = [G[j] for j, x in enumerate(rows)
                   if x["group"] == r["group"] and x["state"] == r["state"]]
        sizes.append(len(members))
        out.append(normalise(G[i], members, norm))
    return out, sizes, G


def gigpo(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories"):
    a_e = grpo(rows, norm, episode_stats)
    a_s, _, _ = step_adv(rows, gamma, norm)
    return [e + omega * s for e, s in zip(a_e, a_s)]


def gaca(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories", kappa=0.25,
         form="linear", scope="trajectory", w_min=0.0, w_max=2.0, lambda_bar=0.5):
    a_e = grpo(rows, norm, episode_stats)
    a_s, sizes, _ = step_adv(rows, gamma, norm)
    key = {"trajectory": lambda r: r["traj"], "group": lambda r: r["group"],
           "batch": lambda r: 0}[scope]
    out = []
    for i, r in enumerate(rows):
        pool = [x["nll"] for j, x in enumerate(rows) if key(x) == key(r) and sizes[j] >= 2]
        z = 0.0
        if sizes[i] >= 2 and len(pool) >= 2 and pop_std(pool) > 0:
            z = (r["nll"] - mean(pool)) / (pop_std(pool) + EPS)
        if form == "convex":
            lam = min(max(lambda_bar + kappa * z, 0.0), 1.0) if sizes[i] >= 2 else 0.0
            out.append((1 - lam) * a_e[i] + lam * a_s[i])
            continue
        if form == "linear":
            w = omega * min(max(1 + kappa * z, w_min), w_max)
        else:
            w = omega * 2 / (1 + math.exp(-kappa * z))
        out.append(a_e[i] + w * a_s[i])
    return out


def adastep(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories"):
    a_e = grpo(rows, norm, episode_stats)
    a_s, _, G = step_adv(rows, gamma, norm)
    out = []
    for i, r in enumerate(rows):
        idx = [j for j, x in enumerate(rows)
               if x["group"] == r["group"] and x["state"] == r["state"]]
        by_action = defaultdict(list)
        for j in idx:
            by_action[rows[j]["action"]].append(G[j])
        total = pop_std([G[j] for j in idx]) ** 2
        w = 1.0
        if len(by_action) >= 2 and min(map(len, by_action.values())) >= 2 and total > 0:
            w = 1 - sum(len(v) / len(idx) * pop_std(v) ** 2 for v in by_action.values()) / total
        out.append(a_e[i] + omega * w * a_s[i])
    return out


def pgpo(rows, gamma=0.95, norm="std", gamma_p=1.0, alpha=2.0, beta=1.0,
         success_threshold=0.0):
    a_s, _, G = step_adv(rows, gamma, norm)
    R = episode_returns(rows)

    def phi(group, state):
        vals = [G[j] for j, x in enumerate(rows) if x["group"] == group and x["state"] == state]
        return mean(vals) if vals else None

    position = {(r["traj"], r["t"]): i for i, r in enumerate(rows)}
    delta = []
    for i, r in enumerate(rows):
        if r["terminal"]:
            target = r["reward"]
        else:
            target = phi(r["group"], r["next_state"])
            if target is None:
                nxt = position.get((r["traj"], r["t"] + 1))
                target = G[nxt] if nxt is not None else 0.0
        delta.append(gamma_p * target - phi(r["group"], r["state"]))
    out = []
    for i, r in enumerate(rows):
        members = [delta[j] for j, x in enumerate(rows)
                   if x["group"] == r["group"] and x["state"] == r["state"]]
        trajs = {x["traj"] for x in rows if x["group"] == r["group"]}
        p_succ = mean([1.0 if R[tr] > success_threshold else 0.0 for tr in trajs])
        out.append(a_s[i] + beta * (1 - p_succ) ** alpha * normalise(delta[i], members, norm))
    return out


def graft(rows, gamma=0.99, lam=0.95, iters=20_000):
    nodes = {(r["group"], r["state"]) for r in rows} | {(r["group"], r["next_state"]) for r in rows}
    V = {n: 0.0 for n in nodes}
    for _ in range(iters):
        new = {}
        for n in nodes:
            outs = [r for r in rows if (r["group"], r["state"]) == n]
            new[n] = mean([r["reward"] + (0.0 if r["terminal"] else
                                          gamma * V[(r["group"], r["next_state"])])
                           for r in outs]) if outs else 0.0
        done = max(abs(new[n] - V[n]) for n in nodes) < 1e-14
        V = new
        if done:
            break
    delta = [r["reward"] + (0.0 if r["terminal"] else gamma * V[(r["group"], r["next_state"])])
             - V[(r["group"], r["state"])] for r in rows]
    position = {(r["traj"], r["t"]): i for i, r in enumerate(rows)}
    out = []
    for r in rows:
        acc, h = 0.0, 0
        while (r["traj"], r["t"] + h) in position:
            acc += (gamma * lam) ** h * delta[position[(r["traj"], r["t"] + h)]]
            h += 1
        out.append(acc)
    return out


def empg(rows, k=1.0, k_prime=1.0, zeta=0.1, norm="std", episode_stats="trajectories"):
    a = grpo(rows, norm, episode_stats)
    H = [r["entropy"] if r.get("entropy") is not None else r["nll"] for r in rows]
    lo, hi = min(H), max(H)
    h = [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in H]
    e = [math.exp(-k * x) for x in h]
    g = [x / mean(e) for x in e]
    position = {(r["traj"], r["t"]): i for i, r in enumerate(rows)}
    out = []
    for i, r in enumerate(rows):
        nxt = position.get((r["traj"], r["t"] + 1))
        f_next = math.exp(-k_prime * h[nxt]) if nxt is not None else 0.0
        out.append(g[i] * a[i] + zeta * f_next)
    m = mean(out)
    return [x - m for x in out]


def anchor_actions(rows, G, i):
    """The returns of row i's anchor group, and of its rows that took each action."""
    r = rows[i]
    idx = [j for j, x in enumerate(rows) if x["group"] == r["group"] and x["state"] == r["state"]]
    by_action = defaultdict(list)
    for j in idx:
        by_action[rows[j]["action"]].append(G[j])
    return [G[j] for j in idx], by_action


def ecpo(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories", kappa=2.0,
         gate=True, tau=4.0):
    """The paper's form: mu~_a = (n_a mean_a + kappa mean_s) / (n_a + kappa), A_act =
    mu~_a - mean_s; rho_s = tanh(n_s / tau) B_s / (B_s + W_s + eps)."""
    a_e = grpo(rows, norm, episode_stats)
    G = returns_to_go(rows, gamma)
    out = []
    for i, r in enumerate(rows):
        members, by_action = anchor_actions(rows, G, i)
        mine, mu_s = by_action[r["action"]], mean(members)
        a_act = 0.0
        if len(members) >= 2:
            shrunk = (len(mine) * mean(mine) + kappa * mu_s) / (len(mine) + kappa)
            a_act = shrunk - mu_s
        between = sum(len(v) * (mean(v) - mu_s) ** 2 for v in by_action.values())
        within = sum((g - mean(v)) ** 2 for v in by_action.values() for g in v)
        rho = math.tanh(len(members) / tau) * between / (between + within + EPS) if gate \
            else 1.0
        out.append(a_e[i] + omega * rho * a_act)
    return out


def ecpo_scaled(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories",
                kappa=2.0, gate=True):
    a_e = grpo(rows, norm, episode_stats)
    G = returns_to_go(rows, gamma)
    out = []
    for i, r in enumerate(rows):
        members, by_action = anchor_actions(rows, G, i)
        mine = by_action[r["action"]]
        step = 0.0
        if len(members) >= 2:
            scale = sample_std(members) + EPS if norm == "std" else 1.0
            step = len(mine) / (len(mine) + kappa) * (mean(mine) - mean(members)) / scale
        between = sum(len(v) * (mean(v) - mean(members)) ** 2 for v in by_action.values())
        within = sum((g - mean(v)) ** 2 for v in by_action.values() for g in v)
        g_s = (between / (between + within) if between + within > 0 else 0.0) if gate else 1.0
        out.append(a_e[i] + omega * g_s * step)
    return out


def shrink(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories"):
    a_e = grpo(rows, norm, episode_stats)
    G = returns_to_go(rows, gamma)
    anchors = {}
    for i, r in enumerate(rows):
        anchors[(r["group"], r["state"])] = anchor_actions(rows, G, i)
    noise = {}
    for key, (members, by_action) in anchors.items():
        dof = len(members) - len(by_action)
        within = sum((g - mean(v)) ** 2 for v in by_action.values() for g in v)
        noise[key] = (within, dof)
    pooled_dof = sum(d for _, d in noise.values())
    pooled = sum(w for w, _ in noise.values()) / pooled_dof if pooled_dof else None
    out = []
    for i, r in enumerate(rows):
        members, by_action = anchors[(r["group"], r["state"])]
        mine = by_action[r["action"]]
        lam = 0.0
        within, dof = noise[(r["group"], r["state"])]
        k, n = len(by_action), len(members)
        if pooled is not None and k >= 2:
            sigma2 = within / dof if dof > 0 else pooled
            ms_b = sum(len(v) * (mean(v) - mean(members)) ** 2
                       for v in by_action.values()) / (k - 1)
            n0 = (n - sum(len(v) ** 2 for v in by_action.values()) / n) / (k - 1)
            tau2 = max(0.0, (ms_b - sigma2) / n0)
            lam = tau2 / (tau2 + sigma2 / len(mine)) if tau2 > 0 else 0.0
        step = 0.0
        if n >= 2:
            scale = sample_std(members) + EPS if norm == "std" else 1.0
            step = (mean(mine) - mean(members)) / scale
        out.append(a_e[i] + omega * lam * step)
    return out


def spread(rows, gamma=0.95, omega=1.0, norm="std", episode_stats="trajectories", w_max=4.0):
    a_e = grpo(rows, norm, episode_stats)
    a_s, _, G = step_adv(rows, gamma, norm)
    d = {}
    for i, r in enumerate(rows):
        members, by_action = anchor_actions(rows, G, i)
        between = sum(len(v) * (mean(v) - mean(members)) ** 2 for v in by_action.values())
        d[(r["group"], r["state"])] = (math.sqrt(between / len(members)), len(by_action))
    several = [v for v, k in d.values() if k >= 2]
    typical = mean(several) if several else 0.0
    out = []
    for i, r in enumerate(rows):
        d_s, _ = d[(r["group"], r["state"])]
        w = omega * min(max(d_s / typical, 0.0), w_max) if typical > 0 else 0.0
        out.append(a_e[i] + w * a_s[i])
    return out


REFERENCE = {"ecpo": ecpo, "ecpo_scaled": ecpo_scaled, "shrink": shrink, "spread": spread, "grpo": grpo, "rloo": rloo, "reinforce_pp": reinforce_pp, "gigpo": gigpo,
             "gaca": gaca, "adastep": adastep, "pgpo": pgpo, "graft": graft, "empg": empg}
