#!/usr/bin/env bash
# Issue 49's GPU rows in one call: data.storage=host against device at SECONDS_AT (60) s of training on
# lego (the official split) and on a generated capture that data.storage=auto puts on the host on this GPU
# (`benchmarks.big_captures generate --gb auto`: 1.1x auto's limit, half the GPU's free memory, at most a
# third of the host's memory); steps/s and held-out PSNR of each run (nerf_lightning.bench.curve), host over
# device per capture, and auto's choice for each capture from the sizes the runs log. The capture is
# rendered while the CUDA extension builds; each run is time-boxed, all end by DEADLINE_S
# (benchmarks/gpu_common.sh), and a run that would not fit is skipped (summary.json says so).
#
#   bash benchmarks/big_captures_gpu.sh LEGO_DIR OUT
#   bash benchmarks/big_captures_gpu.sh .devdata/lego_official "$OUT"
#
# OUT receives (one level, 8 files at most): generate.json, lego_device.json, lego_host.json,
# large_host.json, large_device.json (each run's curve.json), summary.json (the table: steps/s, PSNR, host
# / device, auto's choice), steps.tsv and logs.tgz. lego's PSNR is the mean over its 50 test views (50 of
# the 200 official ones); the generated capture's over 8 held-out views.
# Environment (defaults: the GPU call): SECONDS_AT=60, LARGE_GB=auto (or GB), LARGE_VIEWS=32 (renders; the
# capture lists them as often as the size needs) LARGE_W=2000 LARGE_H=1500, LARGE_ROOT=/tmp/large,
# RATE_DEVICE=330 RATE_HOST=130 LARGE_RATE_DEVICE=300 LARGE_RATE_HOST=110 (steps/s guesses that size each
# run's max_steps: one run each, no retry), LEGO_ARGS="experiment=blender data.val_split=test
# data.max_test_views=50", EXTRA (training overrides of every run, e.g. the CPU try's), RUNS="lego_device
# lego_host large_host large_device" (which, in order); DEADLINE_S, WHEELS, SKIP_EXT as in gpu_common.sh.
# The CPU try (tests/benchmarks/test_big_captures_gpu.py) runs it on generated scenes in seconds.
# GPU time (one H100): ~75 s of set-up, ~95 s per lego run, ~120 s per run of the ~46 GB capture: ~8.5 min.
set -uo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash benchmarks/big_captures_gpu.sh LEGO_DIR OUT" >&2
    exit 2
fi
LEGO=$(realpath "$1") OUT=$(realpath -m "$2")
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
SECONDS_AT=${SECONDS_AT:-60}
LARGE_ROOT=${LARGE_ROOT:-/tmp/large}
SCRATCH=$(mktemp -d)
mkdir -p "$SCRATCH/logs"
read -r -a extra <<<"${EXTRA:-}"
read -r -a lego_args <<<"${LEGO_ARGS:-experiment=blender data.val_split=test data.max_test_views=50}"

# curve NAME RATE LIMIT OVERRIDES...: one bench.curve run of SECONDS_AT s; curve.json -> OUT/NAME.json
curve() {
    local name=$1 rate=$2 limit=$3
    shift 3
    # --tolerance 99: one run, however far the guess was (its training seconds are reported)
    step "$name" "$limit" $((SECONDS_AT + 40)) "$PY" -m benchmarks.big_captures curve --checkpoints "$SECONDS_AT" \
        --rate "$rate" --tolerance 99 --label "$name" --out "$SCRATCH/$name" -- logger=none "${extra[@]}" "$@" \
        >"$SCRATCH/logs/$name.log" 2>&1 && cp "$SCRATCH/$name/curve.json" "$OUT/$name.json"
}

RUNS=${RUNS:-lego_device lego_host large_host large_device}
gpu_wheels || exit 2
# the capture renders on the CPU cores while the extension builds
[[ " $RUNS " == *" large_"* ]] && step generate 240 60 "$PY" -m benchmarks.big_captures generate --gb "${LARGE_GB:-auto}" \
    --views "${LARGE_VIEWS:-32}" --width "${LARGE_W:-2000}" --height "${LARGE_H:-1500}" --root "$LARGE_ROOT" \
    --json "$OUT/generate.json" >"$SCRATCH/logs/generate.log" 2>&1 &
generating=$!
gpu_extension
wait "$generating"
LARGE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$OUT/generate.json" 2>/dev/null)
[ -n "$LARGE" ] && df -h "$LARGE_ROOT" | tail -n 1
for run in $RUNS; do
    case $run in
        lego_device) curve "$run" "${RATE_DEVICE:-330}" 150 "${lego_args[@]}" "data.path=$LEGO" data.storage=device ;;
        lego_host) curve "$run" "${RATE_HOST:-130}" 150 "${lego_args[@]}" "data.path=$LEGO" data.storage=host ;;
        large_host | large_device)
            [ -n "$LARGE" ] || { echo "$run: no generated capture" >&2; continue; }
            rate=${LARGE_RATE_DEVICE:-300}
            [ "$run" = large_host ] && rate=${LARGE_RATE_HOST:-110}
            curve "$run" "$rate" 200 "data.path=$LARGE" data.max_val_views=8 data.max_test_views=8 \
                "data.storage=${run#large_}" ;;
        *) echo "big_captures_gpu.sh: RUNS: unknown run $run" >&2; exit 2 ;;
    esac
done
"$PY" -m benchmarks.big_captures summarize "$OUT" --logs "$SCRATCH/logs"
(cd "$SCRATCH/logs" && tar -czf "$OUT/logs.tgz" ./*.log)
cat "$OUT/steps.tsv"
status=0
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$OUT/steps.tsv" || status=1
rm -rf "$SCRATCH"
echo "big_captures_gpu.sh: done at $(elapsed)s, status $status"
exit "$status"
