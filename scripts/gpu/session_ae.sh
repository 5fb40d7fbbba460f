#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Eighth device session, call AE (nvidia-h200, one GPU; 2026-12-01): the loss-weighted sampler's
# alpha and uniform floor under today's recipe (call AB measured its defaults, alpha 1 / floor 0.2,
# and the error map). Stronger weighting (alpha 2, floor 0.1) on fox and lego, weaker (alpha 0.5,
# floor 0.5) on fox, 5000 steps, seeds 1-3; uniform is call AB's. Three lanes share the GPU (fixed
# steps: no speed number is reported).
set -u
R=/tmp/rae; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego $C trainer.max_steps=5000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
LW="data.sampler=loss_weighted"
STRONG="$LW data.samplers.loss_weighted.alpha=2.0 data.samplers.loss_weighted.uniform_floor=0.1"
WEAK="$LW data.samplers.loss_weighted.alpha=0.5 data.samplers.loss_weighted.uniform_floor=0.5"
lane() {
    local s=$1
    go fox_strong_s$s 85 120 $FOX seed=$s $STRONG; go lego_strong_s$s 55 100 $LEGO seed=$s $STRONG
    go fox_weak_s$s 80 120 $FOX seed=$s $WEAK
}
( lane 1 ) & ( lane 2 ) & ( lane 3 ) &
wait
el "all done"; cat $OUT/rows.txt
