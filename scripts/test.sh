#!/usr/bin/env bash
# Install what the tests need (into .venv) and run pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${GACA_TEST_EXTRAS:-alfworld,train,dev}"
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
python -m pytest "$@"
