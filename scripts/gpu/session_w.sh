#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Sixth device session, call W (nvidia-h200, one GPU; 2026-12-01): hash-table size at fixed steps,
# three lanes sharing the GPU (no speed number of this call is reported), with near-camera gradient
# scaling now the default. lego 20k steps, 2^19 against 2^20 at seeds 2 and 3 (seed 1 in calls U/V);
# fox 5k steps with 2^20 at seeds 1-3 (2^19 with gradient scaling: calls U/V).
set -u
R=/tmp/rw; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv $C trainer.max_steps=20000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
T20="model.field.encoding.log2_hashmap_size=20"
T19="model.field.encoding.log2_hashmap_size=19"
( go lego_t19_20k_s2 130 200 $LEGO seed=2 $T19; go lego_t20_20k_s2 130 200 $LEGO seed=2 $T20 ) &
( go lego_t20_20k_s3 130 200 $LEGO seed=3 $T20; go lego_t19_20k_s3 130 200 $LEGO seed=3 $T19 ) &
( for s in 1 2 3; do go fox_t20_s$s 60 100 $FOX seed=$s $T20; done
  go fox_t19_s1 60 100 $FOX seed=1 $T19 ) &
wait
el "all done"; cat $OUT/rows.txt
