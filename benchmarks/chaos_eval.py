"""gaca-eval with env workers killed under it, one Ctrl-C and a --resume.

    python benchmarks/chaos_eval.py --episodes 10000 --kill-every 500          # Diag
    python benchmarks/chaos_eval.py --env alfworld --episodes 500 --kill-every 100
    python benchmarks/chaos_eval.py --episodes 400 --kill-every 60             # short
    python benchmarks/chaos_eval.py --env scienceworld --episodes 2000 --kill-every 200

Plays the evaluation twice with the random policy (2 workers): once undisturbed, once
with a worker process SIGKILLed at random every ~K finished episodes (uniform in 0.5K to
1.5K) and a SIGINT (Ctrl-C) to gaca-eval halfway, then ``gaca-eval --resume OUT`` to
finish, killing workers as before. Checks: every planned episode is in the results once,
none failed (those on a killed worker are played again), and every episode equals the
undisturbed run's (task, seed, steps, reward, score, won, every action) -- per-episode
seeds make this exact. ``--json PATH`` writes the figures.

ScienceWorld (random play, 10 steps an episode): what is killed is an engine JVM (a Java
child of a worker; each worker's envs share JVMs), and the memory of gaca-eval's process
tree is sampled throughout (its slope after the first fifth is reported).
``--no-reference`` skips the undisturbed run (then nothing is compared but completeness).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gaca_agent.runs.results import read_episodes  # noqa: E402
from reliability_common import (alfworld_kwargs, descendants, memory_mb,  # noqa: E402
                                slope_mb_per_min, write_report)


def eval_cmd(args, out: Path, *extra: str) -> list[str]:
    live = ["--max-live-envs", str(args.max_live_envs)] if args.max_live_envs else []
    return [sys.executable, "-m", "gaca_agent.cli.eval", "--workers", "2", *live, *extra]


def ctrl_c_as_in_a_terminal() -> None:
    """In the child: SIGINT raises KeyboardInterrupt (a shell's background job, such as a
    nohup'd benchmark, starts with SIGINT ignored, and Python then keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def worker_pids(parent: int) -> list[int]:
    """The env worker processes (spawned children) of ``parent``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            pids.append(int(entry.name))
    return pids


def jvm_pids(parent: int) -> list[int]:
    """The engine JVMs below ``parent`` (the java children of its env workers)."""
    out = []
    for pid in descendants(parent):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                out.append(pid)
        except OSError:
            continue
    return out


def lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


class Killer(threading.Thread):
    """SIGKILLs a random worker of the running gaca-eval every ~``every`` new lines."""

    def __init__(self, episodes_file: Path, every: int, seed: int = 0,
                 target: str = "worker") -> None:
        super().__init__(daemon=True)
        self.file, self.every, self.rng = episodes_file, every, random.Random(seed)
        self.targets = jvm_pids if target == "jvm" else worker_pids
        self.proc: subprocess.Popen | None = None
        self.kills, self.done = 0, False
        self.memory: list[tuple[float, float, int]] = []  # (s, PSS MB of the tree, pid)
        self.next_at = self._gap()

    def _gap(self) -> int:
        return max(1, int(self.rng.uniform(0.5, 1.5) * self.every))

    def run(self) -> None:
        t0 = last = time.time()
        while not self.done:
            proc = self.proc
            if proc is not None and proc.poll() is None and time.time() - last >= 2:
                self.memory.append((time.time() - t0, memory_mb(descendants(proc.pid))[1],
                                    proc.pid))
                last = time.time()
            if proc is not None and proc.poll() is None and lines(self.file) >= self.next_at:
                pids = self.targets(proc.pid)
                if pids:
                    try:
                        os.kill(self.rng.choice(pids), signal.SIGKILL)
                        self.kills += 1
                    except ProcessLookupError:
                        pass
                    self.next_at = lines(self.file) + self._gap()
            time.sleep(0.05)


def _read(log) -> str:
    log.seek(0)
    return log.read()


def run_case(args, env_id: str, env_kwargs: list[str], out: Path) -> dict:
    base = ["--env", env_id, "--env-kwargs", *env_kwargs, "--policy", "random",
            "--episodes", str(args.episodes), "--seed", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.time()
    if args.reference:
        ref = subprocess.run(eval_cmd(args, out, *base, "--out", str(out / "undisturbed")),
                             env=env, capture_output=True, text=True)
        assert ref.returncode == 0, ref.stderr[-2000:]
    t_ref = time.time() - t0
    chaos = out / "chaos"
    killer = Killer(chaos / "episodes.jsonl", args.kill_every, target=args.kill)
    killer.start()
    t0 = time.time()
    logs = [tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")]  # never a pipe:
    # gaca-eval's progress bar would fill it and block
    first = subprocess.Popen(eval_cmd(args, out, *base, "--out", str(chaos)), env=env,
                             stdout=subprocess.DEVNULL, stderr=logs[0], text=True,
                             preexec_fn=ctrl_c_as_in_a_terminal)
    killer.proc = first
    while first.poll() is None and lines(chaos / "episodes.jsonl") < args.episodes // 2:
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)  # Ctrl-C halfway
    first.wait(timeout=600)
    interrupted_at = len(read_episodes(chaos / "episodes.jsonl"))
    second = subprocess.Popen(eval_cmd(args, out, "--resume", str(chaos)), env=env,
                              stdout=subprocess.DEVNULL, stderr=logs[1], text=True,
                              preexec_fn=ctrl_c_as_in_a_terminal)
    killer.proc = second
    second.wait(timeout=24 * 3600)
    killer.done = True
    first_err, second_err = (_read(log) for log in logs)
    t_chaos = time.time() - t0
    a = read_episodes(out / "undisturbed" / "episodes.jsonl") if args.reference else {}
    b = read_episodes(chaos / "episodes.jsonl")
    keys = ("task_id", "seed", "steps", "reward", "score", "won")
    differ = [i for i in a if i not in b or any(a[i][k] != b[i][k] for k in keys)
              or [s["action"] for s in a[i]["trajectory"]]
              != [s["action"] for s in b[i]["trajectory"]]]
    results = json.loads((chaos / "results.json").read_text())
    with open(chaos / "episodes.jsonl") as f:
        written = [json.loads(x) for x in f if x.strip()]
    return {"env": env_id, "episodes": args.episodes, "kills": killer.kills,
            "ctrl_c_exit_code": first.returncode, "finished_before_resume": interrupted_at,
            "resume_exit_code": second.returncode,
            "failed_records_written_then_replayed": sum(r["failed"] for r in written),
            "indices_in_results": sorted(b) == list(range(args.episodes)),
            "failed_in_results": sum(r["failed"] for r in b.values()),
            "results_n": results["n"], "results_complete": results.get("complete"),
            "episodes_differing_from_undisturbed": len(differ) if args.reference else None,
            "first_differing": differ[:5],
            "success_undisturbed": json.loads((out / "undisturbed" / "results.json")
                                              .read_text())["success_rate"]
            if args.reference else None,
            "success_chaos": results["success_rate"],
            "seconds_undisturbed": round(t_ref, 1), "seconds_chaos": round(t_chaos, 1),
            "killed": args.kill, **memory_report(killer.memory),
            "stderr_tail": (first_err[-300:], second_err[-300:])}


def memory_report(samples: list[tuple[float, float, int]]) -> dict:
    """PSS of gaca-eval's process tree: largest, and the slope over each gaca-eval process
    (the first, then the resumed one) after its first fifth (workers and JVMs starting)."""
    if not samples:
        return {}
    slopes = []
    for pid in dict.fromkeys(p for *_, p in samples):
        own = [(t, m) for t, m, p in samples if p == pid]
        start, end = own[0][0], own[-1][0]
        slopes.append(round(slope_mb_per_min([x for x in own
                                              if x[0] >= start + (end - start) / 5]), 2))
    return {"pss_max_mb": round(max(m for _, m, _ in samples)),
            "pss_slope_after_warmup_mb_per_min": slopes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", choices=["diag", "alfworld", "scienceworld"], default="diag")
    p.add_argument("--kill", choices=["worker", "jvm"], default=None,
                   help="what to SIGKILL (default: jvm for scienceworld, else worker)")
    p.add_argument("--no-reference", dest="reference", action="store_false")
    p.add_argument("--max-live-envs", type=int, default=None, help="gaca-eval's (default: its own)")
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--kill-every", type=int, default=500)
    p.add_argument("--out", type=Path, default=Path("runs/chaos_eval"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    args.kill = args.kill or ("jvm" if args.env == "scienceworld" else "worker")
    if args.env == "alfworld":
        case = ("gaca/ALFWorld-v0", [f"{k}={v}" for k, v in alfworld_kwargs().items()])
    elif args.env == "scienceworld":
        case = ("gaca/ScienceWorld-v0", ["split=test", "max_episode_steps=10"])
    else:
        case = ("gaca/Diag-Corridor-v0", ["split=test"])
    out = args.out / f"{args.env}-{args.episodes}"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    report = run_case(args, *case, out)
    write_report(report, args.json)
    ok = (report["ctrl_c_exit_code"] == 130 and 0 < report["finished_before_resume"]
          < args.episodes and report["indices_in_results"] and report["failed_in_results"] == 0
          and (report["episodes_differing_from_undisturbed"] == 0 or not args.reference)
          and report["kills"] > 0
          and report["resume_exit_code"] == 0)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
