"""``gaca-view``'s HTTP server: the page, and a JSON API over :mod:`store` and :mod:`credit`.

Loopback only unless a token is set; with one, every request carries it (``?token=`` or
``Authorization: Bearer``; the page passes on the token of its own address). Every
failure is answered as ``{"error": reason}`` with its status, so the page shows why.
"""

from __future__ import annotations

import json
import math
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from gaca_agent.runs.rundir import read_metrics
from gaca_agent.view import credit, store
from gaca_envs.net import QuietHangUps

STATIC = Path(__file__).parent / "static"
FILES = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
         "/app.css": ("app.css", "text/css")}


class Api:
    """The JSON routes; each takes the query's parameters."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def runs(self, q: dict[str, str]) -> Any:
        return [store.summary(self.root, name, kind)
                for name, kind in store.discover(self.root)]

    def run(self, q: dict[str, str]) -> Any:
        folder = store.resolve(self.root, q["name"])
        return {**store.summary(self.root, q["name"], store.kind_of(folder)),
                "config": store.read_config(folder), "metrics": read_metrics(folder),
                "iterations": store.iterations(folder)}

    def _records(self, q: dict[str, str]) -> tuple[Path, int, list[dict[str, Any]]]:
        folder = store.resolve(self.root, q["name"])
        it = int(q.get("it", -1))
        return folder, it, store.episodes(folder, it)

    def iteration(self, q: dict[str, str]) -> Any:
        _, it, records = self._records(q)
        return {"iteration": it, "groups": credit.groups(records)}

    def step(self, q: dict[str, str]) -> Any:
        _, _, records = self._records(q)
        return credit.step(records, q["traj"], int(q["t"]))

    def compare(self, q: dict[str, str]) -> Any:
        from gaca_agent.analysis.rescore import rollout_files

        folder, it = store.resolve(self.root, q["name"]), int(q.get("it", -1))
        files, source = rollout_files(folder, None if it == -1 else it)
        return credit.compare(files, source, [e for e in q.get("est", "").split(",") if e],
                              q.get("anchor", "state"))

    def audit(self, q: dict[str, str]) -> Any:
        _, _, records = self._records(q)
        return credit.audit_groups(records)

    def suite(self, q: dict[str, str]) -> Any:
        sides = [store.episodes(store.resolve(self.root, q[k]), -1) for k in ("a", "b")]
        return {"a": q["a"], "b": q["b"], "rows": credit.suite(*sides)}

    def estimators(self, q: dict[str, str]) -> Any:
        from gaca_agent.advantages import names

        return names()


def make_handler(api: Api, token: str | None) -> type:
    from gaca_envs.net import bearer_ok

    routes: dict[str, Callable] = {f"/api/{n}": getattr(api, n) for n in (
        "runs", "run", "iteration", "step", "compare", "audit", "suite", "estimators")}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if token and not (q.pop("token", None) == token or
                              bearer_ok(self.headers.get("Authorization", ""), token)):
                return self.send(401, {"error": "this gaca-view needs its token: open the "
                                                "address it printed (?token=...)"})
            if url.path in FILES:
                name, kind = FILES[url.path]
                return self.send(200, (STATIC / name).read_bytes(), kind)
            route = routes.get(url.path)
            if route is None:
                return self.send(404, {"error": f"no such page: {url.path}"})
            try:
                return self.send(200, route(q))
            except store.NotFound as e:
                return self.send(404, {"error": str(e)})
            except (KeyError, ValueError) as e:
                return self.send(400, {"error": f"bad request: {e}"})
            except Exception as e:  # noqa: BLE001 - the page shows the reason
                traceback.print_exc()
                return self.send(500, {"error": f"{type(e).__name__}: {e}"})

        def send(self, status: int, body: Any, kind: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else \
                json.dumps(finite(body), default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def finite(x: Any) -> Any:
    """``x`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


class ViewServer(QuietHangUps, ThreadingHTTPServer):
    daemon_threads = True


def make_server(root: Path, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None) -> ThreadingHTTPServer:
    """The viewer's server over ``root`` (not started: ``serve_forever``)."""
    from gaca_envs.net import is_loopback

    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to serve {host!r} without a token: pass --token (or "
                         "serve on 127.0.0.1)")
    if not Path(root).is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    return ViewServer((host, port), make_handler(Api(Path(root)), token))
