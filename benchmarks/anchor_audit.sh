#!/bin/bash
# The anchor audit of docs/benchmarks.md: rollouts in groups of 8 per task (as in
# training) with the random policy and with the expert taking a random action 30% of the
# time, on ALFWorld valid_seen / valid_unseen and WebShop test; then gaca-audit on each
# run and one summary table (the "all" rows of every run).
#
#   bash benchmarks/anchor_audit.sh [OUT]        # OUT defaults to runs/audit
#
# The expert on ALFWorld replans with Fast Downward after every random action, which
# takes minutes per group on 2 cores: those two runs stop after EXPERT_SECONDS (default
# 900) with SIGINT, and gaca-eval keeps the episodes finished so far.
set -u
OUT=${1:-runs/audit}
EXPERT_SECONDS=${EXPERT_SECONDS:-900}
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
common=(--episodes 32 --group-size 8 --workers 2)

for split in valid_seen valid_unseen; do
  gaca-eval --env gaca/ALFWorld-v0 --env-kwargs split=$split --policy random \
    "${common[@]}" --out "$OUT/alf-$split-random"
  timeout -s INT "$EXPERT_SECONDS" gaca-eval --env gaca/ALFWorld-v0 --env-kwargs split=$split \
    --policy expert --policy-kwargs epsilon=0.3 "${common[@]}" --out "$OUT/alf-$split-expert30"
done
gaca-eval --env gaca/WebShop-v0 --env-kwargs split=test --policy random \
  "${common[@]}" --out "$OUT/webshop-test-random"
gaca-eval --env gaca/WebShop-v0 --env-kwargs split=test --policy expert \
  --policy-kwargs epsilon=0.3 "${common[@]}" --out "$OUT/webshop-test-expert30"

runs=(alf-valid_seen-random alf-valid_seen-expert30 alf-valid_unseen-random
      alf-valid_unseen-expert30 webshop-test-random webshop-test-expert30)
for run in "${runs[@]}"; do
  gaca-audit "$OUT/$run" --similarity 0.9 --out "$OUT/$run/audit"
done

python - "$OUT" "${runs[@]}" <<'EOF'
import json, sys
from pathlib import Path
out, runs = Path(sys.argv[1]), sys.argv[2:]
print("| rollouts | anchor | step rows | singleton | mean group | alias (groups / rows) | split (states / rows) |")
print("|---|---|---|---|---|---|---|")
for run in runs:
    report = json.loads((out / run / "audit" / "audit.json").read_text())
    episodes = sum(1 for _ in open(out / run / "episodes.jsonl"))
    for env, per_task in report["results"].items():
        for anchor, r in per_task["all"].items():
            print(f"| {run} ({episodes} episodes) | {anchor} | {r['rows']} | "
                  f"{r['singleton_frac']:.3f} | {r['mean_group_size']:.2f} | "
                  f"{r['alias_rate']:.3f} / {r['alias_row_share']:.3f} | "
                  f"{r['split_rate']:.3f} / {r['split_row_share']:.3f} |")
EOF
