#!/usr/bin/env bash
# shellcheck disable=SC2086
# Issue 24, goal 4: what else helps photographs' backgrounds (fruit: garbled wall, blurred bed, dark
# floaters near the banana; fox). Fixed steps, seeds 1-3, fox and fruit, three lanes share the GPU
# (fixed-step PSNR does not depend on the sharing; no speed number is reported). STEPS defaults to
# 5000 (about a third of each scene's 60 s point: 3 seeds x 2 scenes x 60 s is 6 GPU-minutes per
# variant); a winner is confirmed at 60 s with bench.peers --label NAME -- <its overrides>.
# Variants in priority order (each lane runs them in this order; `go` skips what would end past LIMIT):
#   base   the defaults
#   t21    model.field.encoding.log2_hashmap_size=21   (4x the table: fruit's 32-unit box shares 2^19
#          entries between the fruit and the room; +0.26 dB per step on lego at 20k)
#   dist   model.distortion_weight=0.001               (mip-NeRF 360's loss against floaters; 0.01
#          collapsed fruit, nerfacto uses 0.002)
#   cone   model.large_scene_cone_angle=0.001953125    (1/512: twice the samples in the far field)
# ~8 min with LIMIT=450: bash scripts/gpu/session_photo_ab.sh (after the usual wheel install).
set -u
R=/tmp/rphoto; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
STEPS=${STEPS:-5000}
FOX="data.path=.devdata/fox $C trainer.max_steps=$STEPS"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=$STEPS"
declare -A V=(
    [base]=""
    [t21]="model.field.encoding.log2_hashmap_size=21"
    [dist]="model.distortion_weight=0.001"
    [cone]="model.large_scene_cone_angle=0.001953125"
)
lane() {  # lane SEED: every variant on fox and fruit at this seed, in priority order
    local s=$1 v
    for v in base t21 dist cone; do
        go fox_${v}_s$s 45 150 $FOX seed=$s ${V[$v]}
        go fruit_${v}_s$s 40 150 $FRUIT seed=$s ${V[$v]}
    done
}
( lane 1 ) &
( lane 2 ) &
( lane 3 ) &
wait
el "all done"; cat $OUT/rows.txt
