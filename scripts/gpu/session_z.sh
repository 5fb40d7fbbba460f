#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Seventh device session, call Z (nvidia-h200, one GPU; 2026-12-01): three lanes sharing the GPU
# (fixed-step quality runs; no speed number of this call is reported). Call Y found +0.61 dB on lego
# at 20k steps (seed 1) with nerfacc's pixel centres + evaluation background. Here: seeds 2 and 3
# against the default in the same call, the two halves apart at seed 1, pixel centres on fox (5k
# steps, seeds 1-3, with the default beside them) and on the real fruit capture (2k steps).
set -u
R=/tmp/rz; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego $C trainer.max_steps=20000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
CENTRES="data.pixel_jitter=false data.train_background=eval"
NOJIT="data.pixel_jitter=false"
EVALBG="data.train_background=eval"
( go lego_centres_s2 150 230 $LEGO seed=2 $CENTRES; go lego_centres_s3 150 230 $LEGO seed=3 $CENTRES
  go fox_nojit_s1 45 90 $FOX seed=1 $NOJIT; go fox_def_s1 45 90 $FOX seed=1
  go fruit_nojit_s42 40 80 $FRUIT seed=42 $NOJIT ) &
( go lego_def_s2 150 230 $LEGO seed=2; go lego_def_s3 150 230 $LEGO seed=3
  go fox_nojit_s2 45 90 $FOX seed=2 $NOJIT; go fox_def_s2 45 90 $FOX seed=2
  go fruit_nojit_s5 40 80 $FRUIT seed=5 $NOJIT ) &
( go lego_nojit_s1 150 230 $LEGO seed=1 $NOJIT; go lego_evalbg_s1 150 230 $LEGO seed=1 $EVALBG
  go fox_nojit_s3 45 90 $FOX seed=3 $NOJIT; go fox_def_s3 45 90 $FOX seed=3
  go fruit_nojit_s3 40 80 $FRUIT seed=3 $NOJIT ) &
wait
el "all done"; cat $OUT/rows.txt
