"""The command lines: argument parsing and nothing else; each ``main`` calls the package
that does the work. A mistake in a command's inputs ends it with one line on stderr
(``prog: error: ...``) and exit code 2, before anything is created (``fail``)."""

from __future__ import annotations

import sys


def fail(prog: str, message: str, code: int = 2) -> int:
    """Say ``message`` as the command's one-line error; the exit code to return."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code
