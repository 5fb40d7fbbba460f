#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012  # override lists split into words on purpose; per-GPU subshells; png names are ours
# Fourth device session, call L (nvidia-h200-x2), issue 9: the resolution schedule and loss-weighted
# ray sampling at fixed steps with the near-plane default (model.near_plane=0.2), 3 seeds; lego and
# fox 5000 steps, fruit 2000 steps. Baselines (same defaults, session_k.sh): lego seed 1 34.785;
# fox seeds 1-3 28.419 / 27.072 / 28.182; fruit seeds 42, 5, 6, 4 24.369 / 25.839 / 22.428 / 26.308.
# One single-GPU job per GPU, side by side. Runs are skipped (a row says so) when their expected
# duration would cross LIMIT seconds of the script's time (the call has a fixed device budget).
set -u
R=/tmp/rl; mkdir -p $R
# shellcheck disable=SC1091  # sourced from the repository root
source scripts/gpu/lib.sh
LIMIT=${LIMIT:-410}
load_extension
LEGO="experiment=blender data.path=.devdata/lego $C trainer.max_steps=5000"
FOX="data.path=.devdata/fox $C trainer.max_steps=5000"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
RS='data.resolution_schedule=[[0.0,4],[0.1,2],[0.25,1]]'
LW="data.sampler=loss_weighted"
( export CUDA_VISIBLE_DEVICES=0
  for s in 2 3; do go lego_def_s$s 37 60 $LEGO seed=$s; done
  for s in 1 2 3; do go lego_rs_s$s 37 60 $LEGO "$RS" seed=$s; done
  for s in 1 2 3; do go lego_lw_s$s 37 60 $LEGO $LW seed=$s; done
  for s in 42 5; do go fruit_rs_s$s 36 55 $FRUIT "$RS" seed=$s; done
  cp "$(ls $R/fruit_rs_s42/val/*.png 2>/dev/null | tail -1)" "$OUT/fruit_rs_s42.png" 2>/dev/null
  go fruit_def_s7 36 55 $FRUIT seed=7 ) &
( export CUDA_VISIBLE_DEVICES=1
  for s in 1 2 3; do go fox_rs_s$s 54 80 $FOX "$RS" seed=$s; done
  for s in 1 2 3; do go fox_lw_s$s 54 80 $FOX $LW seed=$s; done
  go fruit_rs_s6 36 55 $FRUIT "$RS" seed=6
  go fruit_def_s8 36 55 $FRUIT seed=8 ) &
wait
el "all done"; cat "$OUT/rows.txt"; cat "$OUT/fails.txt" 2>/dev/null
