#!/usr/bin/env bash
# Install what the tests need (into .venv) and run pytest. Extra args go to pytest
# (a later -m overrides the slow filter: -m slow runs only the slow ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${GACA_TEST_EXTRAS:-alfworld,webshop,train,envserver,scienceworld,dev,docs,integrations,ray}"
# vLLM's and SGLang's own code as the server client's test oracle (a side environment).
if [ "${GACA_TEST_UPSTREAM:-1}" = 1 ]; then
    bash scripts/setup_upstream.sh
fi
# verifiers (it pins mcp 2, which OpenEnv's client cannot take) in its own side environment.
if [ "${GACA_TEST_VERIFIERS:-1}" = 1 ]; then
    bash scripts/setup_verifiers.sh
fi
# The browser tests need Debian's Chromium and its driver.
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver (apt-get)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null && \
        $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null || \
        echo "warning: could not install chromium; browser tests will be skipped"
fi
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
# CI keeps the real data sets (ALFWorld games, WebShop files) beside the clone
if [ -z "${GACA_DATA:-}" ] && [ -d ../shared/data ]; then export GACA_DATA="$(cd ../shared/data && pwd)"; fi
# Two workers (pytest-xdist; GACA_TEST_WORKERS=0 runs in one process). Tests marked slow
# run only with GACA_TEST_SLOW=1 (CI sets it); the 15 slowest are listed at the end.
WORKERS="${GACA_TEST_WORKERS:-2}"
ARGS=(--durations=15)
# loadgroup: tests marked xdist_group share a worker (and its module fixtures)
if [ "$WORKERS" != 0 ]; then ARGS+=(-n "$WORKERS" --dist loadgroup); fi
if [ "${GACA_TEST_SLOW:-0}" != 1 ]; then ARGS+=(-m "not slow"); fi
python -m pytest "${ARGS[@]}" "$@"
