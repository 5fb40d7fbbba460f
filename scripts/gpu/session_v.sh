#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Sixth device session, call V (nvidia-h200, one GPU; 2026-12-01): fixed-step quality A/Bs in three
# lanes sharing the GPU (no speed number of this call is reported). Near-camera gradient scaling
# (model.gradient_scaling_distance=1.0) against the default on lego and fox (seeds 2, 3; seed 1 in
# call U) and on fruit (seeds 42, 5 default; 1, 2, 3 both); MLP weight decay on lego and fox (seed 1);
# lego with a 2^20 table at 20k steps (2^19 and 2^21 in call U).
set -u
R=/tmp/rv; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv $C trainer.max_steps=5000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
GS="model.gradient_scaling_distance=1.0"
( for s in 2 3; do go lego_def_s$s 60 100 $LEGO seed=$s; go lego_gs1_s$s 60 100 $LEGO seed=$s $GS; done
  go lego_t20_20k 150 200 experiment=blender data.path=.devdata/lego logger=csv $C trainer.max_steps=20000 seed=1 model.field.encoding.log2_hashmap_size=20 ) &
( for s in 2 3; do go fox_def_s$s 60 100 $FOX seed=$s; go fox_gs1_s$s 60 100 $FOX seed=$s $GS; done
  go lego_wd_s1 60 100 $LEGO seed=1 model.mlp_weight_decay=1e-6
  go fox_wd_s1 60 100 $FOX seed=1 model.mlp_weight_decay=1e-6 ) &
( go fruit_def_s42 40 80 $FRUIT seed=42; go fruit_def_s5 40 80 $FRUIT seed=5
  for s in 1 2 3; do go fruit_def_s$s 40 80 $FRUIT seed=$s; go fruit_gs1_s$s 40 80 $FRUIT seed=$s $GS; done ) &
wait
el "all done"; cat $OUT/rows.txt
