#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Eighth device session, call AD (nvidia-h200, one GPU; 2026-12-01). Call AB found the per-view error
# map (data.sampler=loss_weighted, error_map_resolution=16) +0.34 dB on fox at 5k steps (3 of 3 seeds)
# and -0.17 dB on lego. Before it can become the default for photographs: fox at 20k steps with it
# (seeds 1-3; uniform at 20k is call Y's), and the real phone capture fruit at 2000 steps, uniform
# against the error map at the 7 seeds of call V, in this call. Three lanes share the GPU (fixed steps:
# no speed number is reported).
set -u
R=/tmp/rad; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
FOX="data.path=.devdata/fox $C trainer.max_steps=20000"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
EMAP="data.sampler=loss_weighted data.samplers.loss_weighted.error_map_resolution=16"
uni() { go fruit_uni_s$1 40 80 $FRUIT seed=$1; }
emap() { go fruit_emap_s$1 40 80 $FRUIT seed=$1 $EMAP; }
( go fox20k_emap_s1 190 240 $FOX seed=1 $EMAP; uni 42; emap 42; uni 8; emap 8; uni 3 ) &
( go fox20k_emap_s2 190 240 $FOX seed=2 $EMAP; uni 5; emap 5; uni 1; emap 1; emap 3 ) &
( go fox20k_emap_s3 190 240 $FOX seed=3 $EMAP; uni 6; emap 6; uni 2; emap 2 ) &
wait
el "all done"; cat $OUT/rows.txt
