#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Prepared in the seventh session (2026-12-01); run in the eighth as call AB (BENCHMARKS.md).
# nvidia-h200, one GPU. The CUDA tests alone first (they cover nothing new since call Y, but the
# training runs below are the first GPU runs of: the step statistics detached before the counters,
# last.ckpt on a 60 s cadence, data.pixel_jitter/train_background=auto), then issue 9's last A/B in
# three lanes sharing the GPU (fixed steps: no speed number is reported): the loss-weighted sampler
# under today's recipe, uniform against the sampler's defaults and against its per-view error map,
# on lego and fox at 5000 steps, seeds 1-3.
set -u
R=/tmp/rab; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
cuda_tests cuda_tests 150 -m cuda tests
LEGO="experiment=blender data.path=.devdata/lego $C trainer.max_steps=5000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
LW="data.sampler=loss_weighted"
EMAP="data.sampler=loss_weighted data.samplers.loss_weighted.error_map_resolution=16"
lane() {  # lane SEED: the three samplers on lego, then on fox
    local s=$1
    go lego_uni_s$s 55 110 $LEGO seed=$s; go lego_lw_s$s 55 110 $LEGO seed=$s $LW
    go lego_emap_s$s 55 110 $LEGO seed=$s $EMAP
    go fox_uni_s$s 90 140 $FOX seed=$s; go fox_lw_s$s 90 140 $FOX seed=$s $LW
    go fox_emap_s$s 90 140 $FOX seed=$s $EMAP
}
( lane 1 ) & ( lane 2 ) & ( lane 3 ) &
wait
el "all done"; cat $OUT/rows.txt
