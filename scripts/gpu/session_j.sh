#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012  # override lists split into words on purpose; per-GPU subshells; png names are ours
# Third device session, call 3 (nvidia-h200-x2; 2026-11-30):
#   GPU 0: lego curve at 60 s alone (issue 8); lego and fox 5000 steps with a 100-step linear
#          learning-rate warm-up from 1 % (nerfacc's), seeds 1-3 (issue 9; call 2 has the defaults)
#   GPU 1: fruit 2000 steps: default at seeds 42 and 4-6 (is the failure seed-dependent?), and with
#          the warm-up at seeds 42 and 1-6
set -u
R=/tmp/rj; mkdir -p $R
# shellcheck disable=SC1091  # sourced from the repository root
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego $C"
W="model.scheduler.warmup_steps=100"
( export CUDA_VISIBLE_DEVICES=0
  timeout -k 10 130 python3 -m nerf_lightning.bench.curve --out $R/c60 --checkpoints 60 --rate 231 --tolerance 1 -- $LEGO > $R/c60.log 2>&1
  echo "rc=$? c60 alone" >> "$OUT/rows.txt"; grep '^\[curve\]' $R/c60.log >> "$OUT/rows.txt"; cp $R/c60/curve.json "$OUT/c60_alone.json"; el c60
  for s in 1 2 3; do run lego_warm_s$s 60 $LEGO trainer.max_steps=5000 seed=$s $W; done
  for s in 1 2 3; do run fox_warm_s$s 60 data.path=.devdata/fox $C trainer.max_steps=5000 seed=$s $W; done ) &
( export CUDA_VISIBLE_DEVICES=1
  F="data.path=.devdata/fruit $C trainer.max_steps=2000"
  for s in 42 4 5 6; do run fruit_def_s$s 45 $F seed=$s; done
  cp "$(ls $R/fruit_def_s42/val/*.png 2>/dev/null | tail -1)" "$OUT/fruit_def_s42.png" 2>/dev/null
  for s in 42 1 2 3 4 5 6; do run fruit_warm_s$s 45 $F seed=$s $W; done
  cp "$(ls $R/fruit_warm_s42/val/*.png 2>/dev/null | tail -1)" "$OUT/fruit_warm_s42.png" 2>/dev/null ) &
wait
el "all done"; cat "$OUT/rows.txt"
