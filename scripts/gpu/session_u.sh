#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012
# Sixth device session, call U (nvidia-h200, one GPU; 2026-12-01). Three lanes share the GPU (fixed-step
# quality runs: their PSNR does not depend on the GPU being shared; no speed number of this call is
# reported). Lane 1: all CUDA tests (the rewritten capture test, the sm_80 guards), the default
# precision (auto) on lego and fox. Lane 2: fruit at the failing seeds with near-camera gradient
# scaling (issue 9). Lane 3: lego at 20k steps with hash tables of 2^19, 2^20, 2^21 (issue 8's 300 s
# point), gradient scaling on lego and fox.
set -u
R=/tmp/ru; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
build_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
FOX="data.path=.devdata/fox"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
panel() { mkdir -p "$OUT/panels"; cp "$(ls "$R/$1"/val/*.png 2>/dev/null | tail -1)" "$OUT/panels/$1.png" 2>/dev/null; }
( cuda_tests cuda_tests 170 -m cuda tests
  go lego_auto_s1 70 100 $LEGO $C trainer.max_steps=5000 seed=1
  grep -h "^precision" $R/lego_auto_s1/.hydra/config.yaml | sed 's/^/lego_auto_s1 resolved /' >> $OUT/rows.txt
  go fox_auto_s1 70 100 $FOX $C trainer.max_steps=5000 seed=1 ) &
( for spec in "gs1 6" "gs1 8" "def 8" "gs05 6" "gs05 8" "gs1 42" "gs1 5" "def 6"; do
    set -- $spec
    case $1 in gs1) X="model.gradient_scaling_distance=1.0";; gs05) X="model.gradient_scaling_distance=0.5";; *) X="";; esac
    go fruit_$1_s$2 45 80 $FRUIT seed=$2 $X; panel fruit_$1_s$2
  done ) &
( go lego_t19_20k 150 200 $LEGO $C trainer.max_steps=20000 seed=1
  go lego_t21_20k 150 200 $LEGO $C trainer.max_steps=20000 seed=1 model.field.encoding.log2_hashmap_size=21
  go lego_gs1_s1 70 100 $LEGO $C trainer.max_steps=5000 seed=1 model.gradient_scaling_distance=1.0
  go fox_gs1_s1 70 100 $FOX $C trainer.max_steps=5000 seed=1 model.gradient_scaling_distance=1.0 ) &
wait
el "all done"; cat $OUT/rows.txt
