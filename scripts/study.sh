#!/usr/bin/env bash
# The comparison study: grpo, gigpo, gaca, adastep, pgpo, empg x 3 seeds on
# gaca/Diag-Signs-v0 and gaca/Diag-SignsLong-v0, plus GACA's ablations (forms, kappa,
# nll_span) on the first, all with the same budget; then curves, tables and plots.
# About half an hour on 2 CPU cores. Extra arguments go to gaca-study (--preset ci for
# the reduced version).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "alfworld,train,dev"
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${STUDY_OUT:-runs/study}"
gaca-study --preset full --out "$OUT" --jobs 2 "$@"
echo "study directory: $OUT (summary.json, table.md, study_*.png)"
