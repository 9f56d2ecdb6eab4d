"""gaca-serve under a long soak: many concurrent clients, streams, cancels, bad bodies.

    python benchmarks/soak_gaca_serve.py --minutes 10                 # 64 clients
    python benchmarks/soak_gaca_serve.py --minutes 1 --clients 16     # short

The server runs the built-in tiny model (``gaca_agent.policies.tiny_model``) in a child
process. Each client thread sends, at random: a plain chat request, one with ``n`` 2-4, a
stream read to its end, a stream cancelled after its first chunk (the socket closed), a
body announced as 9 MiB (over the 8 MiB limit), or a body that is not JSON.

Reported: requests by kind and status; every request must be answered, with 200 or a
4xx/429 carrying a message (``unanswered`` and ``5xx`` must be 0); after the soak, 16
requests at once must all finish (no slot left stuck by a cancelled stream); the
server's error lines; its RSS every 10 s with the least-squares slope after the first
fifth of the run (MB per minute). ``--json PATH`` writes it all.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reliability_common import rss_mb, slope_mb_per_min, write_report  # noqa: E402

from gaca_envs.net import free_port  # noqa: E402

KINDS = ("chat", "n>1", "stream", "cancelled stream", "oversized", "not json")
WEIGHTS = (50, 15, 15, 10, 5, 5)


def chat_body(rng: random.Random, **extra) -> bytes:
    words = " ".join(rng.choice(["go", "north", "take", "key", "open", "door"])
                     for _ in range(rng.randint(1, 30)))
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": words}],
                       "max_tokens": rng.randint(1, 8), "logprobs": True, **extra}).encode()


def one_request(port: int, kind: str, rng: random.Random) -> tuple[int | None, str]:
    """(status or None when unanswered, note)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        if kind == "oversized":
            conn.putrequest("POST", "/v1/chat/completions")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(9 << 20))
            conn.endheaders(b"{")
            response = conn.getresponse()
            return response.status, response.read()[:200].decode("utf-8", "replace")
        if kind == "not json":
            body = b"{this is not json"
        elif kind == "n>1":
            body = chat_body(rng, n=rng.randint(2, 4))
        elif kind in ("stream", "cancelled stream"):
            body = chat_body(rng, stream=True)
        else:
            body = chat_body(rng)
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        if kind == "cancelled stream" and response.status == 200:
            response.readline()  # the first chunk arrived: hang up mid-stream
            conn.sock.shutdown(socket.SHUT_RDWR)
            return response.status, "cancelled"
        data = response.read()
        if response.status >= 400 and b"message" not in data and b"detail" not in data:
            return response.status, "no message"
        if kind == "stream" and response.status == 200 and b"data: [DONE]" not in data:
            return None, "stream ended without [DONE]"
        return response.status, ""
    except (OSError, http.client.HTTPException) as err:
        return None, f"{type(err).__name__}: {err}"[:200]
    finally:
        conn.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    from gaca_agent.policies.tiny_model import build_tiny_model

    folder = Path(tempfile.mkdtemp(prefix="gaca-soak-"))
    model = build_tiny_model(folder / "model")
    port, log = free_port(), tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "gaca_agent.cli.serve", f"hf:{model}",
                             "--name", "tiny", "--port", str(port), "--device", "cpu",
                             "--max-queue", str(4 * args.clients), "--log-level", "WARNING"],
                            stdout=log, stderr=log)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    start = time.time()
    stop = start + 60 * args.minutes
    counts: collections.Counter = collections.Counter()
    problems: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        rng = random.Random(i)
        while time.time() < stop:
            kind = rng.choices(KINDS, WEIGHTS)[0]
            status, note = one_request(port, kind, rng)
            with lock:
                counts[(kind, status)] += 1
                if status is None or status >= 500 or note == "no message":
                    problems.append(f"{kind}: {status} {note}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(args.clients)]
    for t in threads:
        t.start()
    rss: list[tuple[float, float]] = []
    while any(t.is_alive() for t in threads):
        rss.append((round(time.time() - start, 1), round(rss_mb(proc.pid), 1)))
        time.sleep(10)
    rss.append((round(time.time() - start, 1), round(rss_mb(proc.pid), 1)))
    # no stuck slot: 16 requests at once all finish
    t0 = time.time()
    after: list = [None] * 16
    probes = [threading.Thread(target=lambda k: after.__setitem__(
        k, one_request(port, "chat", random.Random(k))[0]), args=(k,)) for k in range(16)]
    for t in probes:
        t.start()
    for t in probes:
        t.join(timeout=300)
    after_s = time.time() - t0
    proc.terminate()
    proc.wait(timeout=60)
    log.seek(0)
    lines = log.read().splitlines()
    error_lines = [x for x in lines if "Traceback" in x or "ERROR" in x]
    warm = [s for s in rss if s[0] >= 0.2 * 60 * args.minutes]
    by_kind = collections.defaultdict(dict)
    for (kind, status), n in sorted(counts.items(), key=str):
        by_kind[kind][str(status)] = n
    report = {"clients": args.clients, "minutes": args.minutes,
              "requests": sum(counts.values()), "by_kind_and_status": by_kind,
              "unanswered": sum(n for (k, s), n in counts.items() if s is None),
              "5xx": sum(n for (k, s), n in counts.items() if s is not None and s >= 500),
              "problems": len(problems), "first_problems": problems[:5],
              "after_soak_16_at_once": {"statuses": after, "seconds": round(after_s, 1)},
              "server_error_lines": len(error_lines), "first_server_errors": error_lines[:5],
              "rss_mb_start": rss[0][1], "rss_mb_after_warmup": warm[0][1] if warm else None,
              "rss_mb_end": rss[-1][1],
              "rss_slope_mb_per_min_after_warmup": round(slope_mb_per_min(warm), 3),
              "rss_samples": rss}
    write_report(report, args.json)


if __name__ == "__main__":
    main()
