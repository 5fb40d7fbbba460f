#!/usr/bin/env bash
# Issue 64's call for the step's speed on one GPU, in the order that decides the most first; each part has its
# own folder under OUT and its own timeout, all end by 535 s, and each job runs alone on the GPU:
#
#   OUT/ab     the CUDA extension built (csrc changed since .devdata/ext.tgz) and packed into OUT/ab/ext.tgz,
#              then the A/B on lego: the loop's ms a step, model.graph_optimizer=auto against false (~80 s)
#   OUT/own    the update graph's GPU tests (~30 s)
#   OUT/kern   suite step-kernels: the warp hash backward and reuse_features, their GPU tests, the graphed
#              step alone (benchmarks.census) of the default and each, the loop of the default and both (~240 s)
#
#   bash benchmarks/update_graph_gpu.sh OUT
#
# Carry .whl/ and DATA/lego (default DATA=.devdata; the call of 2026-12-08 carried DATA=.devdata/ab, the first
# 60 training views of lego and 2 val and test views, made by
#   python -m benchmarks.trim_capture .devdata/lego .devdata/ab/lego --train 60 --val 2 --test 2).
# The next call (the curve at 15, 60 and 300 s with the winners) carries OUT/ab/ext.tgz as .devdata/ext.tgz.
set -u
if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/update_graph_gpu.sh OUT" >&2
    exit 2
fi
ROOT=$(realpath -m "$1")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
DEADLINE_S=${DEADLINE_S:-535}  # every part ends by then (gpu_common.sh's step clips each to the time left)
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
DATA=${DATA:-.devdata}
export STEPS_TSV=$ROOT/steps.tsv
mkdir -p "$ROOT"
part() {  # folder, timeout, runner arguments...: one step of gpu_common.sh, its runner told the time it has
    local folder=$1 to=$2 left=$((DEADLINE_S - $(elapsed)))
    shift 2
    ((to > left)) && to=$left
    OUT=$ROOT/$folder step "$folder" "$to" 30 bash benchmarks/suite_gpu.sh "$@" --data "$DATA" \
        --limit $((to - 10)) >"$ROOT/$folder.log" 2>&1
    tail -3 "$ROOT/$folder.log"
}
part ab 240 update-graph --only 'loop_*' --pack-extension
part own 50 update-graph-tests
part kern 245 step-kernels
for folder in ab own kern; do
    echo "## $folder"
    tail -14 "$ROOT/$folder/table.txt" 2>/dev/null | cut -c1-330
done
