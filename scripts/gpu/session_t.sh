#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fifth device session, call T (nvidia-h200-x2; 2026-11-30): the fused MLP with the output layer's
# bias gradient summed in fp32 and its launch queries cached (capture-safe). GPU0: a 3000-step
# bf16 calibration run; if it trains (>= 33 dB), the lego 300 s point under bf16-mixed. GPU1: the
# fused-MLP tests, all CUDA tests, the census per precision, 5k-step quality under mixed precision
# (lego, fox), the lego 15 s and 60 s points under bf16-mixed.
set -u
R=/tmp/rt; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
build_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
( export CUDA_VISIBLE_DEVICES=0
  run cal_bf16 60 $LEGO $C trainer.max_steps=3000 seed=1 precision=bf16-mixed
  read -r RATE OK < <(python3 -c "import json; m=json.load(open('$R/cal_bf16/metrics.json')); print(round(0.97*m['steps']/m['time/train_s']), int(m['val/psnr'] >= 33.0))" 2>/dev/null || echo "300 0")
  echo "$RATE" > $R/rate.txt; echo "calibrated rate $RATE ok=$OK" >> $OUT/rows.txt
  if [ "$OK" = 1 ]; then
    timeout -k 10 400 python3 -m nerf_lightning.bench.curve --checkpoints 300 --rate $RATE --tolerance 1 --out $R/c300 -- $LEGO precision=bf16-mixed > $R/c300.log 2>&1
    echo "c300 bf16 rc=$?" >> $OUT/rows.txt; tail -4 $R/c300.log >> $OUT/rows.txt; cp $R/c300/curve.json $OUT/c300_bf16.json 2>/dev/null
    el "c300"
  fi ) &
( export CUDA_VISIBLE_DEVICES=1
  cuda_tests mlp_tests 60 tests/ops/test_fused_mlp_cuda.py
  cuda_tests cuda_tests 120 -m cuda tests
  census 60 32-true bf16-mixed 16-mixed
  go lego_bf16 40 70 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go lego_16 40 70 $LEGO $C trainer.max_steps=5000 seed=1 precision=16-mixed
  go fox_bf16 40 70 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go fox_16 40 70 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=16-mixed
  RATE=$(cat $R/rate.txt 2>/dev/null || echo 300)
  if [ "$(left)" -gt 110 ]; then
    timeout -k 10 100 python3 -m nerf_lightning.bench.curve --checkpoints 60 --rate $RATE --tolerance 1 --out $R/c60 -- $LEGO precision=bf16-mixed > $R/c60.log 2>&1
    echo "c60 bf16 rc=$?" >> $OUT/rows.txt; tail -4 $R/c60.log >> $OUT/rows.txt; cp $R/c60/curve.json $OUT/c60_bf16.json 2>/dev/null
    el "c60"
  fi
  if [ "$(left)" -gt 50 ]; then
    timeout -k 10 45 python3 -m nerf_lightning.bench.curve --checkpoints 15 --rate $RATE --tolerance 1 --out $R/c15 -- $LEGO precision=bf16-mixed > $R/c15.log 2>&1
    echo "c15 bf16 rc=$?" >> $OUT/rows.txt; tail -4 $R/c15.log >> $OUT/rows.txt; cp $R/c15/curve.json $OUT/c15_bf16.json 2>/dev/null
    el "c15"
  fi ) &
wait
el "all done"; cat $OUT/rows.txt
