#!/usr/bin/env bash
# The side environment .venv-verifiers: verifiers 0.4.0 and uv (its harnesses run as uv
# scripts). verifiers pins mcp==2.0.0 and OpenEnv's client (gaca-env-serve) needs mcp<2,
# so they cannot share .venv. It sees .venv's packages (gaca, gymnasium, ...) through a
# .pth file after its own, so its mcp 2 wins here and nothing in .venv changes. The
# verifiers test runs tests/verifiers_probe.py with it and skips when it is absent.
# Needs .venv (bash scripts/setup.sh) first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
bash scripts/side_venv.sh .venv-verifiers
if ! .venv-verifiers/bin/python -c "import verifiers.v1, uv" 2>/dev/null; then
    echo "installing verifiers 0.4.0 and uv into .venv-verifiers"
    .venv-verifiers/bin/python -m pip install --quiet "verifiers==0.4.0" "uv==0.13.8"
fi
.venv-verifiers/bin/python -c "
import mcp, verifiers.v1.tasksets, gaca_verifiers
assert '.venv-verifiers' in mcp.__file__, mcp.__file__
print('verifiers side environment ready in $ROOT/.venv-verifiers')"
