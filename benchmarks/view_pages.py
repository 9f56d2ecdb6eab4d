"""How fast gaca-view opens its pages on a big run.

    python benchmarks/view_pages.py                       # 150 iterations of 16 x 8 x 50
    python benchmarks/view_pages.py --iterations 10 --browser

Writes a synthetic run of the shape gaca-train keeps (``metrics.jsonl``, ``config.yaml``,
``rollouts/iter-*.rank0.jsonl.gz``: groups x group size episodes of a fixed length, each
step with an observation, response, state key, advantage and weight), serves it with
gaca-view on 127.0.0.1 and times each page's requests over HTTP: the runs list, the run
(curves), an iteration (first open, then again), a step with its anchor group, the audit
and a three-estimator comparison. With ``--browser`` it also times headless Chromium from
navigation to the drawn page. Prints a table and ``--json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def write_run(folder: Path, iterations: int, groups: int, size: int, steps: int) -> None:
    rng = random.Random(0)
    (folder / "rollouts").mkdir(parents=True)
    (folder / "config.yaml").write_text(
        f"name: big\niterations: {iterations}\nenv:\n  id: gaca/ALFWorld-v0\n"
        "model:\n  path: Qwen/Qwen2.5-1.5B-Instruct\nalgo:\n  estimator: gaca\n")
    with open(folder / "metrics.jsonl", "w") as m:
        for it in range(iterations):
            m.write(json.dumps({"iteration": it, "rollout/success": rng.random(),
                                "losses/policy": rng.gauss(0, 1), "losses/kl": rng.random(),
                                "perf/collect_s": 30 + rng.random()}) + "\n")
            path = folder / "rollouts" / f"iter-{it:05d}.rank0.jsonl.gz"
            with gzip.open(path, "wt", compresslevel=1) as f:
                for g in range(groups):
                    for k in range(size):
                        traj = g * size + k
                        trajectory = [{
                            "t": t, "observation": f"You are in room {t % 9} of task {g}. " * 4,
                            "admissible_actions": [f"go to shelf {i}" for i in range(12)],
                            "response": f"<think>step {t}</think><action>go to shelf {t % 12}"
                                        "</action>", "action": f"go to shelf {t % 12}",
                            "format_valid": True, "action_valid": True, "reward": 0.0,
                            "env_reward": 0.0, "penalty": 0.0, "state_key": f"{g}-{t % 20}",
                            "next_state_key": f"{g}-{(t + 1) % 20}", "terminated": False,
                            "truncated": t == steps - 1, "nll": rng.random(),
                            "nll_spans": {"response": rng.random()}, "entropy": None,
                            "advantage": rng.gauss(0, 1), "weight": 0.5 + rng.random(),
                            "info": {}} for t in range(steps)]
                        f.write(json.dumps({
                            "index": traj, "group": g, "traj": traj, "task_id": g,
                            "task": f"put a thing in shelf {g}", "won": False, "reward": 0.0,
                            "steps": steps, "failed": False, "trajectory": trajectory}) + "\n")


def timed(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        r.read()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--browser", action="store_true", help="also time headless Chromium")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    from gaca_agent.view.app import make_server

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        write_run(root / "big", args.iterations, args.groups, args.group_size, args.steps)
        size = sum(f.stat().st_size for f in (root / "big" / "rollouts").iterdir())
        print(f"wrote {args.iterations} iterations ({size / 1e6:.0f} MB gzipped) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        server = make_server(root)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        last = args.iterations - 1
        it = f"{base}/api/iteration?name=big&it={last}"
        pages = {
            "runs list": f"{base}/api/runs", "run (curves)": f"{base}/api/run?name=big",
            "iteration, first open": it, "iteration, again": it,
            "step + anchor group": f"{base}/api/step?name=big&it={last}&traj=5&t=7",
            "anchor audit": f"{base}/api/audit?name=big&it={last}",
            "3 estimators re-scored": f"{base}/api/compare?name=big&it={last}"
                                      "&est=grpo,gigpo,gaca",
        }
        report = {"iterations": args.iterations, "episodes_per_iteration":
                  args.groups * args.group_size, "steps": args.steps,
                  "rows_per_iteration": args.groups * args.group_size * args.steps,
                  "seconds": {name: timed(url) for name, url in pages.items()}}
        if args.browser:
            report["browser_seconds"] = browser_times(base, last)
        server.shutdown()
    for name, s in {**report["seconds"], **{f"browser: {k}": v for k, v in
                                            report.get("browser_seconds", {}).items()}}.items():
        print(f"{name:32s} {s:7.3f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def shown(driver, css: str) -> None:
    """Wait for ``css`` to be in the page, asked in one script (asking selenium for
    thousands of cells would time selenium, not the page)."""
    while not driver.execute_script("return !!document.querySelector(arguments[0])", css):
        time.sleep(0.01)


def browser_times(base: str, last: int) -> dict[str, float]:
    from selenium.webdriver.common.by import By

    from gaca_envs.webshop.browser import Browser

    browser = Browser(timeout_s=120)
    d = browser.driver
    out = {}
    try:
        for name, hash_, css in (("runs list", "#/", "#runs-table"),
                                 ("run (curves)", "#/run/big", "#curve-success svg"),
                                 ("iteration", f"#/it/big/{last}", "td.cell")):
            d.get("about:blank")
            start = time.perf_counter()
            d.get(base + "/" + hash_)
            shown(d, css)
            out[name] = time.perf_counter() - start
        start = time.perf_counter()
        d.find_element(By.CSS_SELECTOR, "td.cell[data-t='7']").click()
        shown(d, "#step-panel")
        out["click a step"] = time.perf_counter() - start
    finally:
        browser.quit()
    return out


if __name__ == "__main__":
    main()
