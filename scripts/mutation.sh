#!/usr/bin/env bash
# Mutation testing of the areas the next rewrites touch (mutmut 3; not in CI: hours on two
# cores). Usage: bash scripts/mutation.sh [AREA ...] [--workdir DIR] [--report-only]
# Areas and their test files: scripts/mutation.py; equivalent mutants with their reasons:
# scripts/mutation_equivalent.yaml; the report: DIR/report.md (default /tmp/gaca-mutation).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    bash scripts/setup.sh "alfworld,webshop,train,envserver,scienceworld,dev,docs,integrations"
fi
. .venv/bin/activate
python -c "import mutmut" 2>/dev/null || python -m pip install --quiet "mutmut==3.8.1"
exec python scripts/mutation.py "$@"
