#!/usr/bin/env bash
# The side environment .venv-upstream: vLLM 0.33.0 and SGLang 0.5.23 from their wheels,
# without their CUDA dependencies, plus the small packages their protocol, serving and
# LoRA modules import (tests/upstream/requirements.txt, all --no-deps). It sees .venv's
# packages (CPU torch, transformers, pydantic, ...) through a .pth file, so nothing in
# .venv changes. The server-client tests run tests/upstream/oracle.py with it and skip
# when it is absent. Needs .venv (bash scripts/setup.sh ...train...) first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
bash scripts/side_venv.sh .venv-upstream
if ! .venv-upstream/bin/python -c "import vllm, sglang" 2>/dev/null || \
        [ tests/upstream/requirements.txt -nt .venv-upstream/.installed ]; then
    echo "installing vLLM and SGLang (no CUDA dependencies) into .venv-upstream"
    .venv-upstream/bin/python -m pip install --quiet --no-deps -r tests/upstream/requirements.txt
    touch .venv-upstream/.installed
fi
.venv-upstream/bin/python -c "
import vllm.entrypoints.openai.chat_completion.serving, vllm.entrypoints.openai.models.serving
import sglang.srt.entrypoints.openai.protocol, sglang.srt.utils.auth
print('upstream oracle environment ready in $ROOT/.venv-upstream')"
