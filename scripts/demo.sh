#!/usr/bin/env bash
# Fresh machine to trained agent: set up .venv, train the embedded default (the tiny
# in-process model on gaca/Diag-Signs-v0 with GACA; no download), evaluate it on the
# held-out tasks, and print where the run directory is. A few minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "alfworld,train,dev"
. .venv/bin/activate
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
NAME="demo-$(date +%Y%m%d-%H%M%S)"
gaca-train --config default name="$NAME" "$@"
RUN="runs/$NAME"
gaca-eval --env gaca/Diag-Signs-v0 --env-kwargs split=test --policy "hf:$RUN/final/model" \
    --policy-kwargs max_new_tokens=16 history_length=0 temperature=0.4 \
    --episodes all --out "$RUN/eval_test"
python - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
warm = next(r for r in rows if r["iteration"] == -1).get("eval/success")
final = json.load(open(f"{run}/eval_test/results.json"))
print(f"held-out success: warm-up policy {warm:.3f} -> trained {final['success_rate']:.3f} "
      f"(n={final['n']})")
PY
echo "run directory: $RUN  (metrics.jsonl, curves.png, tensorboard/, final/, eval_test/report.html)"
