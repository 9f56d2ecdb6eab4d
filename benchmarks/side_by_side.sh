#!/usr/bin/env bash
# The speed benchmarks of two checkouts, alternately in one run (this machine is shared
# and noisy: compare ratios measured together, never figures from different days).
#
#   bash benchmarks/side_by_side.sh OLD_CHECKOUT NEW_CHECKOUT [OUT]
#
# Each benchmark runs with the checkout first on PYTHONPATH (its own gaca_agent and
# gaca_envs, whatever is installed) from inside that checkout; outputs go to
# OUT/{old,new}-NAME.txt (default OUT: runs/side_by_side). Needs the data sets in
# $GACA_DATA (alfworld/); an older checkout that predates $GACA_DATA finds them itself.
set -euo pipefail
old="$(cd "$1" && pwd)"; new="$(cd "$2" && pwd)"; out="$(mkdir -p "${3:-runs/side_by_side}" && cd "${3:-runs/side_by_side}" && pwd)"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
run() {  # run TAG TREE NAME ARGS...
    local tag=$1 tree=$2 name=$3; shift 3
    echo "== $tag $name: $*"
    (cd "$tree" && PYTHONPATH="$tree" python "benchmarks/$name.py" "$@") > "$out/$tag-$name.txt" 2>&1
    tail -n 25 "$out/$tag-$name.txt"
}
for bench in "bench_estimators" "bench_collector --episodes 16" "bench_envs --games 10" \
             "bench_env_server --seconds ${GACA_SOAK_S:-30}"; do
    set -- $bench
    name=$1; shift
    run old "$old" "$name" "$@"
    run new "$new" "$name" "$@"
done
echo "outputs in $out"
