#!/usr/bin/env bash
# Make (or keep) the side environment DIR beside .venv: a venv of .venv's Python that
# sees .venv's packages (and .venv's own .pth files: gaca's editable install) after its
# own, so what DIR installs wins there and nothing in .venv changes. Prints nothing.
#   bash scripts/side_venv.sh .venv-upstream
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$1"
if [ ! -x .venv/bin/python ]; then
    echo "error: .venv is missing: run bash scripts/setup.sh first" >&2
    exit 1
fi
SITE="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PY="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
if [ ! -x "$DIR/bin/python" ]; then
    "$PY" -m venv "$DIR"
fi
SIDE="$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$SITE')" > "$SIDE/_gaca_main_venv.pth"
