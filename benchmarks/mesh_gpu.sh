#!/usr/bin/env bash
# Issue 48's GPU rows: lego (the official split, Blender format) and fox (instant-ngp format) trained on one
# GPU, then each exported as glb and as ply at equal triangles at the export defaults (200k faces, 2048²
# texture) by benchmarks.mesh_export: export seconds per stage, triangles, file size, and the held-out PSNR
# of the mesh ray-cast from held-out cameras against the field's renders; plus the README's picture, the
# lego glb ray-cast from held-out view SHOT_VIEW. Every step is time-boxed and all end by DEADLINE_S
# (benchmarks/gpu_common.sh): the call fits 9 minutes.
#
#   bash benchmarks/mesh_gpu.sh LEGO_DIR FOX_DIR OUT
#   WHEELS=".whl .devdata/mesh-wheels" bash benchmarks/mesh_gpu.sh .devdata/lego_official_t4 .devdata/fox_q85 "$OUT"
#
# OUT receives seven files, one level deep: lego.json, fox.json (the export rows, with the training run's
# steps, seconds and held-out PSNR under "training"), lego.png, steps.tsv (each step's exit status and
# seconds) and the logs lego_train.log, fox_train.log, export.log. The export needs trimesh, PyMCubes,
# xatlas, fast-simplification and embreex (the mesh's ray casting: through rtree instead, a 200k-face mesh
# takes minutes per view) as wheels: `python -m benchmarks.gpu_calls prepare mesh` puts them in
# .devdata/mesh-wheels and the data in .devdata (docs/benchmarks/gpu-calls.md).
# Environment (defaults: the GPU call): LEGO_STEPS=10000 FOX_STEPS=10000 (about 30 s each on an H100),
# TRAIN_TIMEOUT=150 EXPORT_TIMEOUT=150 (seconds per step, clipped to the deadline), VIEWS=2 WIDTH=800
# (held-out views scored and their largest width), SHOT_VIEW=3, TEST_VIEWS=8 (test views the training run
# scores), EXPORT_ARGS (export overrides; default: none, the export defaults), TRAIN_ARGS (extra training
# overrides for both, e.g. the CPU try's), LEGO_ARGS="experiment=blender data.val_split=test",
# FOX_ARGS="experiment=fox", CAPTURES="lego fox" (which, in order); DEADLINE_S, WHEELS, SKIP_EXT as in
# gpu_common.sh. The CPU try (tests/benchmarks/test_mesh_gpu.py) runs it on a generated scene in seconds.
set -uo pipefail
if [ $# -ne 3 ]; then
    echo "usage: bash benchmarks/mesh_gpu.sh LEGO_DIR FOX_DIR OUT" >&2
    exit 2
fi
LEGO=$(realpath "$1") FOX=$(realpath "$2") OUT=$(realpath -m "$3")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
gpu_setup || exit 2
"$PY" -c "import xatlas, fast_simplification, mcubes, trimesh, scipy" || {
    echo "mesh_gpu.sh: the export's packages are missing (carry their wheels, see the header)" >&2
    exit 2
}
"$PY" -c "import embreex" 2>/dev/null || {  # trimesh casts rays through embree, else through rtree (slow)
    echo "mesh_gpu.sh: no embreex: the PSNR's ray casting takes minutes per view at 200k faces" >&2
    "$PY" -c "import rtree" || exit 2
}
WORK=${WORK:-/tmp/mesh_gpu}
mkdir -p "$WORK"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a export_args <<<"${EXPORT_ARGS:-}"
status=0

train() {  # name, steps, overrides...
    local name=$1 steps=$2
    shift 2
    rm -rf "${WORK:?}/$name"
    step "${name}_train" "${TRAIN_TIMEOUT:-150}" 30 "$PY" -m nerf_lightning.train "$@" "trainer.max_steps=$steps" \
        logger=csv callbacks.progress_bar=null "data.max_test_views=${TEST_VIEWS:-8}" \
        "hydra.run.dir=$WORK/$name" "${train_args[@]}" >"$OUT/${name}_train.log" 2>&1
}

measure() {  # name, extra mesh_export arguments...
    local name=$1
    shift
    echo "== $name" >>"$OUT/export.log"
    step "${name}_export" "${EXPORT_TIMEOUT:-150}" 30 "$PY" -m benchmarks.mesh_export "$WORK/$name" \
        --views "${VIEWS:-2}" --width "${WIDTH:-800}" --json "$OUT/$name.json" "$@" "${export_args[@]}" \
        >>"$OUT/export.log" 2>&1
}

read -r -a lego_args <<<"${LEGO_ARGS:-experiment=blender data.val_split=test}"
read -r -a fox_args <<<"${FOX_ARGS:-experiment=fox}"
for capture in ${CAPTURES:-lego fox}; do
    case $capture in
        lego) train lego "${LEGO_STEPS:-10000}" "${lego_args[@]}" "data.path=$LEGO" ;;
        fox) train fox "${FOX_STEPS:-10000}" "${fox_args[@]}" "data.path=$FOX" ;;
        *) echo "mesh_gpu.sh: CAPTURES: lego and/or fox, not $capture" >&2; exit 2 ;;
    esac || { echo "$capture: training failed" >&2; status=1; }
    [ -f "$WORK/$capture/checkpoints/last.ckpt" ] || continue
    shot=()
    [ "$capture" = lego ] && shot=(--shot "$OUT/lego.png" --shot-view "${SHOT_VIEW:-3}")
    measure "$capture" "${shot[@]}" || { echo "$capture: export failed" >&2; status=1; }
done
tail -n 40 "$OUT/export.log"
cat "$OUT/steps.tsv"
echo "mesh_gpu.sh: done at $(elapsed)s, status $status"
exit $status
