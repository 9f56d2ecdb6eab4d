"""Learning-curve PNGs of a run (from ``metrics.jsonl``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

PANELS = (("rollout/success", "eval/success"), ("losses/policy", "losses/kl"),
          ("adv/weight_std", "adv/singleton_frac"), ("rollout/format_invalid",
                                                      "losses/entropy"))


def plot_run(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    out = run_dir / "curves.png"
    from gaca_agent.runs.rundir import read_metrics

    rows = read_metrics(run_dir)
    size = (4 * len(PANELS), 3.2)
    with figure(out, 1, len(PANELS), figsize=size) as (fig, axes):
        for ax, keys in zip(axes, PANELS):
            for key in keys:
                pts = [(r["iteration"], r[key]) for r in rows if key in r]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=key)
            ax.set_xlabel("iteration")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.suptitle(run_dir.name)
    return out


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def figure(path: str | Path, *args: Any, **kwargs: Any):
    """``plt.subplots(*args, **kwargs)`` as ``(fig, axes)``; on leaving, the figure is laid
    out, written to ``path`` (PNG, 110 dpi) and closed (only closed on an error). The one
    way every plot of the project is drawn."""
    plt = pyplot()
    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
    except BaseException:
        plt.close(fig)
        raise
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
