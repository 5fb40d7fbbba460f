#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Seventh device session, call Y (nvidia-h200, one GPU; 2026-12-01). The CUDA tests alone first (the
# fused MLP's shape and GPU checks now in ops/fused_mlp_support.py), then three lanes sharing the GPU
# (fixed-step quality runs; no speed number of this call is reported). Issue 9: fox at 20k steps with
# today's defaults, seeds 1-3. Issue 8: lego at 20k steps, seed 1: the default against nerfacc's
# pixel centres + evaluation background, and against a finest level of 4096.
set -u
R=/tmp/ry; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
cuda_tests cuda_tests 150 -m cuda tests
LEGO="experiment=blender data.path=.devdata/lego $C trainer.max_steps=20000"
FOX="data.path=.devdata/fox $C trainer.max_steps=20000"
CENTRES="data.pixel_jitter=false data.train_background=eval"
RES4K="model.field.encoding.max_resolution=4096"
( go fox_20k_s1 150 230 $FOX seed=1; go lego_def_s1 150 230 $LEGO seed=1 ) &
( go fox_20k_s2 150 230 $FOX seed=2; go lego_centres_s1 150 230 $LEGO seed=1 $CENTRES ) &
( go fox_20k_s3 150 230 $FOX seed=3; go lego_res4k_s1 150 230 $LEGO seed=1 $RES4K ) &
wait
el "all done"; cat $OUT/rows.txt
