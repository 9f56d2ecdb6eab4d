#!/usr/bin/env bash
# docs/leaderboard.md from the baselines and the CPU runs: random, expert and SmolLM2
# zero-shot (GACA_LEADERBOARD_MODELS=0 leaves it out) on each
# cpu_lm config's held-out protocol (16 episodes, seed 10000: the tasks the runs evaluate
# on), then one table per protocol. Finished evaluations are skipped; add a model with
#   gaca-eval --env ENV --env-kwargs ... --policy openai:URL#MODEL --episodes 16 \
#             --seed 10000 --out runs/leaderboard/SUITE/NAME
# and run this again. Training runs found under runs/ (runs/cpu_lm_*) add their rows.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .venv ]; then . .venv/bin/activate; fi
export HF_HUB_OFFLINE=1

declare -A PROTOCOL=(
  [alfworld]="--env gaca/ALFWorld-v0 --env-kwargs split=valid_seen max_episode_steps=15"
  [webshop]="--env gaca/WebShop-v0 --env-kwargs split=test"
  [scienceworld]="--env gaca/ScienceWorld-v0 --env-kwargs split=dev max_episode_steps=20
    task_types=find-living-thing,find-non-living-thing,find-plant,find-animal"
)
for suite in alfworld webshop scienceworld; do
  for policy in random expert; do
    # shellcheck disable=SC2086
    gaca-eval ${PROTOCOL[$suite]} --policy "$policy" --episodes 16 --seed 10000 \
      --workers 1 --out "runs/leaderboard/$suite/$policy" > /dev/null
  done
  # SmolLM2 zero-shot as the CPU runs evaluate (bf16, temperature 0.4) with their
  # response budget (minutes on 2 cores)
  if [ "${GACA_LEADERBOARD_MODELS:-1}" = 1 ]; then
    # shellcheck disable=SC2086
    gaca-eval ${PROTOCOL[$suite]} --policy smollm2 \
      --policy-kwargs max_new_tokens=24 dtype=bfloat16 temperature=0.4 \
      --episodes 16 --seed 10000 --workers 1 --out "runs/leaderboard/$suite/smollm2" > /dev/null
  fi
done
# the two-task-type ALFWorld runs' protocol (docs/benchmarks.md): 32 episodes
for policy in random expert; do
  gaca-eval --env gaca/ALFWorld-v0 --env-kwargs split=valid_seen \
    "task_types=[pick_and_place_simple, look_at_obj_in_light]" max_episode_steps=15 \
    --policy "$policy" --episodes 32 --seed 10000 --workers 1 \
    --out "runs/leaderboard/alfworld_two/$policy" > /dev/null
done
# cpu_lm/textworld's held-out protocol: 32 of the games TextWorld's generator makes from
# seed 1,000,000 (made once, cached); its run's zero_shot_eval/ is SmolLM2's zero-shot row
for policy in random expert; do
  gaca-eval --env gaca/TextWorld-v0 --env-kwargs max_episode_steps=10 \
    "generate={count: 32, seed: 1000000, rooms: 4, objects: 6, quest_length: 4}" \
    --policy "$policy" --episodes 32 --seed 10000 --workers 1 \
    --out "runs/leaderboard/textworld/$policy" > /dev/null
done
gaca-eval --leaderboard runs/leaderboard $(ls -d runs/cpu_lm_* 2>/dev/null) \
  --out docs/leaderboard.md > /dev/null
echo "wrote docs/leaderboard.md"
