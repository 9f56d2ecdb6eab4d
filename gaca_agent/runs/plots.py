"""Learning-curve PNGs of a run (from ``metrics.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = (("rollout/success", "eval/success"), ("losses/policy", "losses/kl"),
          ("adv/weight_std", "adv/singleton_frac"), ("rollout/format_invalid",
                                                      "losses/entropy"))


def plot_run(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, keys in zip(axes, PANELS):
        for key in keys:
            pts = [(r["iteration"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=key)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
