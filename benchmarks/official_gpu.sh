#!/usr/bin/env bash
# Lego on its published protocol (the official split at 800x800, lossless; 50 of the 200 test views) on one
# GPU, in three parts of at most 9 minutes, each with its own timeouts:
#
#   bash benchmarks/official_gpu.sh screen OUT   # instant-ngp with --nerf_compatibility, 35,000 steps (its
#                                                # published mode), beside this project's candidates at
#                                                # the 60 s point's steps, three at a time sharing the GPU
#   bash benchmarks/official_gpu.sh curve OUT    # this project at 15, 60 and 300 s, alone on the GPU
#   bash benchmarks/official_gpu.sh seeds OUT    # this project at 60 s, seeds 1-3, alone on the GPU
#
# Carry .devdata/lego_official (a copy of ../shared/data/lego_official), .whl/ (the wheels of
# ../shared/device-wheels) and, for `screen`, .peers/ (../shared/peers without its two *-src.tar.gz); also
# .devdata/ext.tgz when an earlier call packed the CUDA extension (OUT/ext.tgz). OUT receives at most 8 files:
# table.txt (one row per run: steps, seconds, steps/s, PSNR over white, over black in sRGB and in linear RGB,
# on the test views and, for the screen, on 10 training views), runs.tgz (each run's metrics.json and log
# tail), ngp_eval.txt / ngp_eval.jsonl (instant-ngp) and ext.tgz (the CUDA extension, when built here).
#
# Environment: SCENE (default .devdata/lego_official); screen: CANDIDATES (`name=override,override;...`,
# default below), STEPS (20400, the 60 s point), LANES (3), RUN_TIMEOUT (280 s a run), DEADLINE (540 s
# from the start), NGP_STEPS (35000), NO_NGP=1 (no instant-ngp); curve/seeds: CURVE_POINTS (15,60,300),
# SEED_POINT (60), SEEDS (seeds of `seeds`, "1 2 3"), TOLERANCE (seconds a timed run may miss its point, 1), WINNER (overrides added to every run, comma-separated; default none), RATE (first guess
# of steps/s, 365); every mode: TRAIN_ARGS (extra overrides of every run, e.g. tiny CPU settings), EVAL_ARGS
# (extra overrides of the eval of the last curve checkpoint on training views).
set -uo pipefail
if [ $# -ne 2 ] || ! [[ $1 =~ ^(screen|curve|seeds)$ ]]; then
    echo "usage: bash benchmarks/official_gpu.sh screen|curve|seeds OUT" >&2
    exit 2
fi
MODE=$1
OUT=$(realpath -m "$2")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
T0=$(date +%s)
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
gpu_wheels || exit 2  # WHEELS (default .whl) to /tmp/site, PYTHONPATH, .devdata/ext.tgz unpacked
export NERF_LIGHTNING_CACHE=${NERF_LIGHTNING_CACHE:-/tmp/official_cache}  # decoded images, shared by the runs
SCENE=$(realpath "${SCENE:-.devdata/lego_official}")
WORK=${WORK:-/tmp/official_gpu}
DEADLINE=${DEADLINE:-540}  # seconds from the start by which every run of the screen has ended
mkdir -p "$OUT" "$WORK"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a eval_args <<<"${EVAL_ARGS:-}"
IFS=, read -r -a winner <<<"${WINNER:-}"
say() { echo "[official_gpu t=$(($(date +%s) - T0))s] $*" | tee -a "$OUT/table.txt"; }
# Every run: the blender preset on the official split, scored on its test views; CSV logs only.
BASE=(experiment=blender "data.path=$SCENE" data.val_split=test logger=csv callbacks.progress_bar=null
    model.save_val_images=false)

build_extension() {  # the CUDA extension, built once per machine (about a minute) and packed for the next
    [ -n "$(ls -A "$TORCH_EXTENSIONS_DIR" 2>/dev/null)" ] && return 0
    timeout 240 "$PY" -m nerf_lightning.ops._ext >"$WORK/ext.log" 2>&1 || { say "extension build failed"; tail -5 "$WORK/ext.log"; }
    [ -n "$(ls -A "$TORCH_EXTENSIONS_DIR" 2>/dev/null)" ] && tar -czf "$OUT/ext.tgz" -C "$TORCH_EXTENSIONS_DIR" .
}

fixed_steps() {  # name, timeout, overrides...: one training run of fixed steps (quality; may share the GPU)
    local name=$1 to=$2 left=$((DEADLINE - $(date +%s) + T0 - 20))
    shift 2
    [ "$left" -lt "$to" ] && to=$left
    [ "$to" -lt 30 ] && { say "$name: skipped (${left}s left of DEADLINE=${DEADLINE}s)"; return 0; }
    rm -rf "${WORK:?}/$name"
    # validation on 10 training views, the final evaluation on the test split
    timeout -k 10 "$to" "$PY" -m nerf_lightning.train "${BASE[@]}" data.val_split=train data.max_val_views=10 \
        trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null callbacks.last_checkpoint=null \
        "${train_args[@]}" "$@" "hydra.run.dir=$WORK/$name" >"$WORK/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || { say "$name: exit $rc"; tail -5 "$WORK/$name.log"; }
}

timed() {  # name, checkpoints, seed, timeout: bench.curve alone on the GPU (its runs sized to the seconds)
    local name=$1 points=$2 seed=$3 to=$4
    rm -rf "${WORK:?}/$name"
    timeout -k 10 "$to" "$PY" -m nerf_lightning.bench.curve --checkpoints "$points" --rate "${RATE:-365}" \
        --tolerance "${TOLERANCE:-1}" --out "$WORK/$name" -- "${BASE[@]}" "seed=$seed" "${train_args[@]}" "${winner[@]}" \
        >"$WORK/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || { say "$name: exit $rc"; tail -5 "$WORK/$name.log"; }
}

ngp_compat() {  # instant-ngp in its published mode, fixed steps, into OUT/ngp_eval.{txt,jsonl}
    [ "${NO_NGP:-0}" = 1 ] && return 0
    JIT=default STEPS="${NGP_STEPS:-35000}" EXTRA=--nerf_compatibility NAME=ngp_compat OUT="$OUT" \
        WORK=/tmp/peers-run timeout -k 10 420 bash .peers/run_scene.sh "$SCENE" >"$WORK/ngp.log" 2>&1
}

say "$MODE on $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no GPU'), $(date -u +%Y-%m-%dT%H:%MZ)"
case $MODE in
screen)
    ngp_compat &
    ngp_pid=$!
    build_extension
    STEPS=${STEPS:-20400}
    # In lane order: the first three side by side with instant-ngp, then the next three. The opacity loss
    # beside random backgrounds (never measured together on a GPU), then candidates against the plateau
    # past a minute, where the field fits its training views and not the test views
    # (docs/benchmarks/2026-12-07.md). The screen of 2026-12-07 ran, at 20,400 steps, the training
    # background, the opacity loss at 1.0, a 2^21 table and a tenth of the occupancy threshold.
    DEFAULT_CANDIDATES="default=;alpha_0.1=model.net.loss.alpha_weight=0.1;t18=model.net.field.encoding.log2_hashmap_size=18"
    DEFAULT_CANDIDATES+=";res1024=model.net.field.encoding.max_resolution=1024;sh3=model.net.field.sh_degree=3"
    DEFAULT_CANDIDATES+=";decay_03=model.scheduler.decay_start=0.3"
    IFS=';' read -r -a cands <<<"${CANDIDATES:-$DEFAULT_CANDIDATES}"
    lanes=${LANES:-3}
    lane_pids=()
    for ((lane = 0; lane < lanes; lane++)); do
        (
            for ((i = lane; i < ${#cands[@]}; i += lanes)); do
                name=${cands[$i]%%=*}
                IFS=, read -r -a ov <<<"${cands[$i]#*=}"
                fixed_steps "$name" "${RUN_TIMEOUT:-280}" "trainer.max_steps=$STEPS" "${ov[@]}"
            done
        ) &
        lane_pids+=($!)
    done
    wait "${lane_pids[@]}"
    wait "$ngp_pid" || say "instant-ngp: exit $?"
    ;;
curve)
    build_extension
    timed curve "${CURVE_POINTS:-15,60,300}" 42 "${CURVE_TIMEOUT:-545}"
    # the last point's field on 10 of its training views: what it learned against what holds for unseen views
    # shellcheck disable=SC2012  # the newest by time, and run folders are named t<seconds>: no odd names
    last=$(ls -t "$WORK"/curve/t*/checkpoints/last.ckpt 2>/dev/null | head -1)
    [ -n "$last" ] && timeout -k 5 45 "$PY" -m nerf_lightning.eval "ckpt=$last" split=train data.max_val_views=10 \
        save_images=false "hydra.run.dir=$WORK/train_views_last" "${eval_args[@]}" >"$WORK/train_views_last.log" 2>&1
    ;;
seeds)
    build_extension
    for seed in ${SEEDS:-1 2 3}; do timed "seeds_60_s$seed" "${SEED_POINT:-60}" "$seed" "${SEED_TIMEOUT:-150}"; done
    ;;
esac
"$PY" -m benchmarks.official_table "$WORK" | tee -a "$OUT/table.txt"
tar -czf "$OUT/runs.tgz" -C "$WORK" --exclude='*.ckpt' --exclude='*.png' --exclude='*.np[yz]' --exclude=cache . 2>/dev/null
say "done"
