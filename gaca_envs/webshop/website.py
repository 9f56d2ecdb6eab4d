"""The local WebShop site (``gaca-webshop-serve``): a Flask app on loopback only.

One session per episode: ``/start/<session>/<task_id>`` opens goal ``task_id`` of the
split and redirects to ``/s/<session>``, the current page. Buttons, product links and
option radios send ``click[...]`` (the search form sends ``search_query``) to
``/act/<session>``, which applies the action and redirects back to the page.
``/state/<session>`` returns the page state, score and key as JSON. Unknown routes and
sessions answer 404, malformed or inadmissible actions 400, always as short plain text
(no stack traces). Pages load nothing from elsewhere.
"""

from __future__ import annotations

import argparse
import re
import threading
from typing import Any

from gaca_envs.net import is_loopback, url_host
from gaca_envs.webshop.html import render_html
from gaca_envs.webshop.pages import MAX_WEBSHOP_ACTION_CHARS, Session
from gaca_envs.webshop.world import World, WorldConfig, load_world

_SESSION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def create_app(world: World, split: str = "test", show_attrs: bool = False):
    """The Flask app over ``world``'s goals of ``split``."""
    from flask import Flask

    app = Flask("gaca_webshop")
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024
    sessions: dict[str, dict[str, Any]] = {}
    app.extensions["gaca_sessions"] = sessions
    for code, message in ((400, "bad request"), (404, "not found"),
                          (405, "method not allowed"), (413, "request too large"),
                          (Exception, "internal error")):
        status = 500 if code is Exception else code
        app.register_error_handler(code, lambda _err, m=message, c=status: _text(m, c))
    _add_routes(app, world, split, show_attrs, sessions)
    return app


def _text(body: str, status: int):
    from flask import Response

    return Response(body + "\n", status=status, mimetype="text/plain")


def _add_routes(app, world: World, split: str, show_attrs: bool,
                sessions: dict[str, dict[str, Any]]) -> None:
    """The site's pages: home, start a session, a session's page, act, its state."""
    from flask import Response, abort, jsonify, redirect, request

    goal_ids = world.split(split)
    lock = threading.Lock()
    text = _text

    def get_session(sid: str) -> dict[str, Any]:
        """The session's entry, or a 404 answer."""
        entry = sessions.get(sid) if _SESSION_RE.match(sid) else None
        if entry is None:
            abort(404)
        return entry

    @app.get("/")
    def home():
        return text(f"gaca WebShop site: {len(goal_ids)} goals in split {split!r}. "
                    "Open /start/<session>/<task_id>.", 200)

    @app.get("/start/<sid>/<int:task_id>")
    def start(sid: str, task_id: int):
        if not _SESSION_RE.match(sid):
            return text("session ids are 1-64 letters, digits, '-' or '_'", 400)
        if not 0 <= task_id < len(goal_ids):
            return text(f"task_id must be in range({len(goal_ids)})", 404)
        with lock:
            sessions[sid] = {"session": world.new_session(goal_ids[task_id], show_attrs),
                             "version": 0}
        return redirect(f"/s/{sid}?v=0", code=303)

    @app.get("/s/<sid>")
    def page(sid: str):
        entry = get_session(sid)
        return Response(render_html(entry["session"], sid), mimetype="text/html")

    @app.route("/act/<sid>", methods=["GET", "POST"])
    def act(sid: str):
        entry = get_session(sid)
        query = request.values.get("search_query")
        action = f"search[{query}]" if query is not None else request.values.get("action", "")
        session: Session = entry["session"]
        with lock:
            canonical = session.resolve(action)
            if canonical is None:
                return text("not a valid action on this page (or longer than "
                            f"{MAX_WEBSHOP_ACTION_CHARS} characters)", 400)
            session.act(canonical)
            entry["version"] += 1
            version = entry["version"]
        return redirect(f"/s/{sid}?v={version}", code=303)

    @app.get("/state/<sid>")
    def state(sid: str):
        entry = get_session(sid)
        s: Session = entry["session"]
        return jsonify(page=s.page.kind, state_key=s.page.key(), score=s.score,
                       version=entry["version"], admissible=list(s.admissible()))


#: A connection that sends nothing for this long (an idle keep-alive, a body that never
#: arrives) is closed, so it cannot hold a server thread forever.
REQUEST_TIMEOUT_S = 30.0


def request_handler(quiet: bool = False, timeout_s: float = REQUEST_TIMEOUT_S):
    """Werkzeug's request handler with a request timeout (its own has none)."""
    from werkzeug.serving import WSGIRequestHandler

    class Handler(WSGIRequestHandler):
        timeout = timeout_s

        def log_request(self, *args, **kwargs):
            if not quiet:  # one line per request is noise in tests and notebooks
                super().log_request(*args, **kwargs)

    return Handler


class BackgroundServer:
    """The site served from a thread on 127.0.0.1 (a free port unless one is given)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        from werkzeug.serving import make_server

        if not is_loopback(host):
            raise ValueError(f"refusing to serve on {host!r}: the site binds to loopback "
                             "addresses only (127.0.0.1, localhost, ::1)")
        self._server = make_server(host, port, app, threaded=True,
                                   request_handler=request_handler(True, request_timeout_s))
        self.port = self._server.server_port
        self.url = f"http://{url_host(host)}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-webshop-serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"])
    parser.add_argument("--goals", default="synthetic", choices=["synthetic", "human"])
    parser.add_argument("--catalog", default=None, help="WebShop product file (default: "
                        "the generated catalogue)")
    parser.add_argument("--attributes", default=None)
    parser.add_argument("--human-file", default=None)
    parser.add_argument("--num-products", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-attrs", action="store_true")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address; the site serves on "
                     "127.0.0.1, localhost or ::1 only")
    world = load_world(WorldConfig(catalog=args.catalog, attributes=args.attributes,
                                   human_file=args.human_file, goals=args.goals,
                                   num_products=args.num_products, seed=args.seed))
    app = create_app(world, args.split, args.show_attrs)
    print(f"WebShop site on http://{url_host(args.host)}:{args.port}/ (split {args.split}, "
          f"{len(world.split(args.split))} goals); open /start/<session>/<task_id>")
    from werkzeug.serving import make_server

    make_server(args.host, args.port, app, threaded=True,
                request_handler=request_handler()).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
