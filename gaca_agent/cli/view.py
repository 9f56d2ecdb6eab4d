"""``gaca-view``: see why each step got its credit, in a local web app.

    gaca-view runs                         # every run and evaluation under runs/
    gaca-view runs/default --port 8765
    gaca-view runs --host 0.0.0.0 --token SECRET    # off loopback: a token is required

Pages: runs and evaluations with their status; a run's curves (refreshed every 2 s while
gaca-train writes); an iteration's groups as step columns coloured by advantage, a
step's prompt, response, action, reward, state key, NLL, weight and anchor group (and how
text anchors would regroup it); estimators side by side (gaca-rescore's code on the
stored rollout; the exact advantage on Diag worlds); evaluations filtered by task type
and outcome; two evaluations per task type; the anchor audit's aliased and split groups.
Reads stored files only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gaca_agent.cli import fail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, nargs="?", default=Path("runs"),
                        help="a run, an evaluation, or a folder of them (default: runs)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", default=None,
                        help="required by every request (needed off loopback)")
    args = parser.parse_args(argv)
    from gaca_agent.view.app import make_server
    from gaca_envs.net import url_host

    try:
        server = make_server(args.path, args.host, args.port, args.token)
    except (ValueError, FileNotFoundError, OSError) as err:
        return fail("gaca-view", str(err))
    query = f"/?token={args.token}" if args.token else "/"
    print(f"gaca-view: http://{url_host(args.host)}:{server.server_address[1]}{query} "
          f"({args.path.resolve()})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
