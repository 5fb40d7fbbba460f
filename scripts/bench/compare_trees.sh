#!/usr/bin/env bash
# The same time-to-quality benchmark (bench.curve) on two source trees, one after the other on one GPU,
# each with its own CUDA extension build: "make bench gives the same numbers before and after a change",
# measured in one run.
#
#   bash scripts/bench/compare_trees.sh BEFORE_TREE [AFTER_TREE] -- [bench.curve arguments] -- [overrides]
#   git archive aee19a6 | tar x -C .old   # a tree to compare with (any checkout of the project)
#   bash scripts/bench/compare_trees.sh .old . -- --checkpoints 60 --rate 380 --tolerance 1 -- \
#       experiment=blender data.path="$PWD/.devdata/lego" logger=csv
#
# AFTER_TREE defaults to this checkout. Both trees' extensions are built first (TORCH_EXTENSIONS_DIR per
# tree under $WORK), so that no build lands inside a timed point. Results: $OUT/{before,after}/curve.json,
# and a table of both printed last. Each tree runs in its own folder: paths in the overrides are absolute.
# Needs the project's dependencies importable (PYTHONPATH may hold a
# site folder such as /tmp/site; each tree's src/ is put first).
set -euo pipefail
before=${1:?usage: compare_trees.sh BEFORE_TREE [AFTER_TREE] -- CURVE_ARGS -- OVERRIDES}
shift
after=.
if [ $# -gt 0 ] && [ "$1" != "--" ]; then after=$1; shift; fi
[ "${1:-}" = "--" ] && shift
curve_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do curve_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
overrides=("$@")
PY=${PYTHON:-python3}
OUT=${OUT:-outputs/bench/compare_trees}
WORK=${WORK:-/tmp/compare_trees}
mkdir -p "$OUT" "$WORK"
site=${PYTHONPATH:-}

declare -A trees=([before]=$(cd "$before" && pwd) [after]=$(cd "$after" && pwd))

run_in() {  # run_in LABEL COMMAND...: a command with that tree's sources and extension cache
    local label=$1 tree=${trees[$1]}
    shift
    (cd "$tree" && PYTHONPATH="$tree/src${site:+:$site}" TORCH_EXTENSIONS_DIR="$WORK/ext_$label" "$@")
}

for label in before after; do
    echo "[compare_trees] $label: ${trees[$label]}: building the CUDA extension"
    run_in "$label" "$PY" -c "from nerf_lightning.ops import _ext; print(_ext.load() is not None)"
done
for label in before after; do
    dest=$(mkdir -p "$OUT/$label" && cd "$OUT/$label" && pwd)
    echo "[compare_trees] $label: bench.curve ${curve_args[*]} -- ${overrides[*]}"
    run_in "$label" "$PY" -m nerf_lightning.bench.curve "${curve_args[@]}" --label "$label" --out "$dest" \
        -- "${overrides[@]}"
done
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'tree':8s} {'point':>6s} {'trained':>8s} {'steps':>7s} {'PSNR':>7s} {'ngp':>7s} {'steps/s':>8s} {'GPU%':>5s}")
for label in ("before", "after"):
    for p in json.loads((out / label / "curve.json").read_text())["points"]:
        print(f"{label:8s} {p['checkpoint_s']:6.0f} {p['train_s']:8.1f} {p['steps']:7d} {p['psnr'] or 0:7.3f} "
              f"{p.get('psnr_ngp') or 0:7.3f} {p['steps_per_s']:8.1f} {p['gpu_utilization'] or 0:5.0f}")
EOF
