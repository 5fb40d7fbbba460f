#!/usr/bin/env bash
# Issue 47's decision, measured on one GPU in one call: fox and fruit, seed 0, 5000 steps, four runs each
# (off, camera_opt, appearance, both), three at a time sharing the GPU (fixed-step runs: their PSNR does not
# depend on the sharing, their speed does, so no speed is reported). Every run has
# model.heldout_fit.enabled=true, so each carries the plain held-out PSNR (val/psnr) and the fair
# protocol's (val/psnr_fitted). Then benchmarks.learned_views applies the rule of issue 61 and prints the
# decision. Every run is time-boxed and all end by DEADLINE_S (benchmarks/gpu_common.sh).
#
#   bash benchmarks/learned_views_gpu.sh DATA OUT
#   bash benchmarks/learned_views_gpu.sh .devdata "$OUT"      # DATA holds fox/ and fruit/
#
# OUT receives: results.jsonl (one row per run: val/psnr, val/psnr_fitted, eval/*, training PSNR as the
# mean of train/psnr over the last 500 steps, steps, the corrections' sizes, exit status), decision.json
# and decision.txt (the table, the changes against off and the decision), steps.tsv and logs.tgz (each
# run's log and metrics.json).
# Environment (defaults: the GPU call): SCENES="fox fruit" VARIANTS="off camera_opt appearance both" SEED=0
# STEPS=5000 LANES=3 RUN_TIMEOUT=240 (seconds per run, clipped to the deadline), TRAIN_ARGS (extra training
# overrides for every run, e.g. the CPU try's); DEADLINE_S, WHEELS, SKIP_EXT as in gpu_common.sh.
# GPU time (one H100 or H200): ~70 s of set-up (wheels, the extension's build), then 3 rounds of ~100 s
# (fox ~330 steps/s alone, ~0.4x of it in a lane of three, ~40 s around each run): ~6 minutes.
set -uo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash benchmarks/learned_views_gpu.sh DATA OUT" >&2
    exit 2
fi
DATA=$(realpath "$1") OUT=$(realpath -m "$2")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
SCENES=${SCENES:-fox fruit}
VARIANTS=${VARIANTS:-off camera_opt appearance both}
SEED=${SEED:-0}
for scene in $SCENES; do
    [ -f "$DATA/$scene/transforms.json" ] || { echo "$DATA/$scene/transforms.json: not found" >&2; exit 2; }
done
gpu_setup || exit 2
WORK=${WORK:-/tmp/learned_views}
rm -rf "$WORK" && mkdir -p "$WORK"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
common=(
    "seed=$SEED" "trainer.max_steps=${STEPS:-5000}" "model.heldout_fit.enabled=true"
    logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000
    callbacks.model_checkpoint=null callbacks.last_checkpoint=null
)

overrides() {  # the variant's overrides (benchmarks/learned_views.py: VARIANTS)
    case $1 in
        off) ;;
        camera_opt) echo model.camera_opt.enabled=true ;;
        appearance) echo model.appearance.enabled=true ;;
        both) echo model.camera_opt.enabled=true model.appearance.enabled=true ;;
        *) echo "unknown variant $1" >&2; return 1 ;;
    esac
}

for scene in $SCENES; do
    for variant in $VARIANTS; do
        extra=$(overrides "$variant") || exit 2
        while (($(jobs -rp | wc -l) >= ${LANES:-3})); do wait -n; done
        name="${scene}_${variant}"
        # shellcheck disable=SC2086  # the variant's overrides are words
        step "$name" "${RUN_TIMEOUT:-240}" 60 "$PY" -m nerf_lightning.train "data.path=$DATA/$scene" "${common[@]}" \
            $extra "hydra.run.dir=$WORK/$name" "${train_args[@]}" >"$WORK/$name.log" 2>&1 &
        sleep 2  # the lanes' start-ups (decoding, graph capture) a little apart
    done
done
wait
"$PY" -m benchmarks.learned_views collect "$WORK" --seed "$SEED" --steps-tsv "$OUT/steps.tsv" \
    --out "$OUT/results.jsonl" >/dev/null
"$PY" -m benchmarks.learned_views decide "$OUT/results.jsonl" --json "$OUT/decision.json" | tee "$OUT/decision.txt"
status=${PIPESTATUS[0]}
(cd "$WORK" && tar -czf "$OUT/logs.tgz" ./*.log ./*/metrics.json 2>/dev/null)
cat "$OUT/steps.tsv"
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$OUT/steps.tsv" || status=1
echo "learned_views_gpu.sh: done at $(elapsed)s, status $status"
exit "$status"
