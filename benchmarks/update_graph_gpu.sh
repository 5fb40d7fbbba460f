#!/usr/bin/env bash
# Issue 64's call for model.graph_optimizer (the optimizer's update in the step's CUDA graph), on one GPU, in
# the order that decides the most first; each part has its own folder under OUT and its own timeout, and each
# job runs alone on the GPU:
#
#   OUT/ab     the A/B on lego: the loop's ms a step, graph_optimizer=auto against false (~80 s)
#   OUT/own    the update graph's GPU tests (~30 s)
#   OUT/tests  pytest -m cuda (~60 s)
#   OUT/host   the stubbed loop (benchmarks.host_loop) of each: the host's share (~120 s)
#   OUT/curve  lego_official (50 of its 200 test views) at CURVE_POINTS (15) s with graph_optimizer=auto
#
#   bash benchmarks/update_graph_gpu.sh OUT
#
# Carry .whl/, DATA/lego (default DATA=.devdata), .devdata/ext.tgz and .devdata/lego_official. With
# lego_official beside it the whole .devdata/lego is too large for a call's 64 MiB: DATA=.devdata/ab holds the
# first 60 training views of lego and 2 val and test views, made by
#   python -m benchmarks.trim_capture .devdata/lego .devdata/ab/lego --train 60 --val 2 --test 2
set -u
if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/update_graph_gpu.sh OUT" >&2
    exit 2
fi
ROOT=$(realpath -m "$1")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
gpu_wheels || exit 2  # once here for this script's own Python; the parts' scripts set up the same way
DATA=${DATA:-.devdata}
suite() {  # folder, timeout, runner arguments...
    local folder=$1 to=$2
    shift 2
    OUT=$ROOT/$folder timeout "$to" bash benchmarks/suite_gpu.sh "$@" --data "$DATA" --limit $((to - 10))
}
suite ab 110 update-graph --only 'loop_*'
suite own 60 update-graph-tests
suite tests 100 cuda-tests
suite host 150 update-graph --only 'host_loop_*'
# the first guess of steps/s: the graphed update's loop rate measured above (365 without one)
RATE=$("$PY" - "$ROOT/ab/rows.jsonl" <<'PY' 2>/dev/null || echo 365
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rate = [r["loop_steps_per_s"] for r in rows if r.get("job") == "loop_graph_update" and r.get("loop_steps_per_s")]
print(round(0.97 * rate[0]) if rate else 365)
PY
)
echo "curve: first guess $RATE steps/s"
WINNER=model.graph_optimizer=auto CURVE_POINTS=${CURVE_POINTS:-15} CURVE_TIMEOUT=${CURVE_TIMEOUT:-110} RATE=$RATE \
    WORK=/tmp/update_graph_curve timeout 150 bash benchmarks/official_gpu.sh curve "$ROOT/curve"
