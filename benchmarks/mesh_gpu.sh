#!/usr/bin/env bash
# The mesh-export measurement of BENCHMARKS.md on one GPU: lego (Blender format) and fox (instant-ngp
# format) trained about 60 s each, then exported as glb and ply at equal triangles (benchmarks.mesh_export:
# export time, triangles, file size, held-out PSNR of the mesh against the field's renders), plus a
# ray-cast screenshot of the lego glb. Every step has its own timeout; the whole run fits 8 minutes on
# one H100.
#
#   bash benchmarks/mesh_gpu.sh LEGO_DIR FOX_DIR OUT
#   bash benchmarks/mesh_gpu.sh .devdata/lego_official .devdata/fox "$OUT"
#
# OUT receives six files, one level deep: lego.json, fox.json (the export rows), lego.png, and the logs
# lego_train.log, fox_train.log, export.log. Carry .whl/ with the wheels of ../shared/device-wheels plus
# the export's (pip download xatlas fast-simplification PyMCubes rtree trimesh --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl) and .devdata/ext.tgz when there is one.
# Environment (defaults for the GPU): LEGO_STEPS=20000 FOX_STEPS=15000 (about 60 s each on an H100),
# TRAIN_TIMEOUT=170 EXPORT_TIMEOUT=110 (seconds per step), VIEWS=2 WIDTH=200 (held-out views scored and
# their width), EXPORT_ARGS (export overrides; default: the export defaults), TRAIN_ARGS (extra training
# overrides, e.g. accelerator=cpu on a machine without a GPU), LEGO_EXPERIMENT=blender FOX_EXPERIMENT=fox.
# Tried on the 2-core CPU with the embedded scene for both (a few steps, small export):
#   TRAIN_ARGS="accelerator=cpu ..." LEGO_EXPERIMENT=fox FOX_EXPERIMENT=fox LEGO_STEPS=60 FOX_STEPS=60 \
#   EXPORT_ARGS="resolution=96 faces=1000 texture_size=256" bash benchmarks/mesh_gpu.sh SCENE SCENE OUT
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: bash benchmarks/mesh_gpu.sh LEGO_DIR FOX_DIR OUT" >&2
    exit 2
fi
LEGO=$(realpath "$1") FOX=$(realpath "$2") OUT=$(realpath -m "$3")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
if [ -f .devdata/ext.tgz ] && [ ! -d "$TORCH_EXTENSIONS_DIR" ]; then
    mkdir -p "$TORCH_EXTENSIONS_DIR" && tar -xzf .devdata/ext.tgz -C "$TORCH_EXTENSIONS_DIR"
fi
"$PY" -c "import xatlas, fast_simplification, mcubes, rtree, trimesh, scipy" || {
    echo "mesh_gpu.sh: the export's packages are missing (carry their wheels in .whl/, see the header)" >&2
    exit 2
}
WORK=${WORK:-/tmp/mesh_gpu}
mkdir -p "$OUT" "$WORK"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a export_args <<<"${EXPORT_ARGS:-}"
status=0

train() {  # name, steps, overrides...
    local name=$1 steps=$2
    shift 2
    rm -rf "$WORK/$name"
    timeout "${TRAIN_TIMEOUT:-170}" "$PY" -m nerf_lightning.train "$@" "trainer.max_steps=$steps" logger=csv data.max_test_views=8 \
        "hydra.run.dir=$WORK/$name" "${train_args[@]}" >"$OUT/${name}_train.log" 2>&1
}

measure() {  # name, extra mesh_export arguments...
    local name=$1
    shift
    echo "== $name" >>"$OUT/export.log"
    timeout "${EXPORT_TIMEOUT:-110}" "$PY" -m benchmarks.mesh_export "$WORK/$name" --views "${VIEWS:-2}" \
        --width "${WIDTH:-200}" --json "$OUT/$name.json" "$@" "${export_args[@]}" >>"$OUT/export.log" 2>&1
}

train lego "${LEGO_STEPS:-20000}" "experiment=${LEGO_EXPERIMENT:-blender}" "data.path=$LEGO" || { echo "lego: training failed ($?)" >&2; status=1; }
[ $status -eq 0 ] && { measure lego --shot "$OUT/lego.png" || { echo "lego: export failed ($?)" >&2; status=1; }; }
train fox "${FOX_STEPS:-15000}" "experiment=${FOX_EXPERIMENT:-fox}" "data.path=$FOX" || { echo "fox: training failed ($?)" >&2; status=1; }
[ -f "$WORK/fox/checkpoints/last.ckpt" ] && { measure fox || { echo "fox: export failed ($?)" >&2; status=1; }; }
tail -n 30 "$OUT/export.log"
exit $status
