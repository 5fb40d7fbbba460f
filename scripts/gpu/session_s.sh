#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fifth device session, call S (nvidia-h200-x2; 2026-11-30): the register-resident fused MLP
# (ops/csrc/mlp.cu, second version) and the CUDA distortion loss, both written without a GPU.
# GPU0: the fused-MLP tests gate everything; then a 3000-step bf16 calibration run and the lego
# 300 s point under bf16-mixed. GPU1: census per precision, all CUDA tests, fixed-step quality under
# mixed precision, fruit with the distortion loss, the lego 60 s point under bf16-mixed.
set -u
R=/tmp/rs; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
build_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
CUDA_VISIBLE_DEVICES=0 cuda_tests mlp_tests 100 tests/ops/test_fused_mlp_cuda.py
MLP_RC=$?
( export CUDA_VISIBLE_DEVICES=0
  if [ $MLP_RC = 0 ]; then
    run cal_bf16 60 $LEGO $C trainer.max_steps=3000 seed=1 precision=bf16-mixed
    RATE=$(python3 -c "import json; m=json.load(open('$R/cal_bf16/metrics.json')); print(round(0.97*m['steps']/m['time/train_s']))" 2>/dev/null || echo 300)
    echo "$RATE" > $R/rate.txt; echo "calibrated rate $RATE" >> $OUT/rows.txt
    timeout -k 10 420 python3 -m nerf_lightning.bench.curve --checkpoints 300 --rate $RATE --tolerance 1 --out $R/c300 -- $LEGO precision=bf16-mixed > $R/c300.log 2>&1
    echo "c300 bf16 rc=$?" >> $OUT/rows.txt; tail -4 $R/c300.log >> $OUT/rows.txt; cp $R/c300/curve.json $OUT/c300_bf16.json 2>/dev/null
    el "c300"
  fi ) &
( export CUDA_VISIBLE_DEVICES=1
  census 80 32-true bf16-mixed 16-mixed
  cuda_tests cuda_tests 150 -m cuda tests
  go fruit_s8_d01 40 60 $FRUIT seed=8 model.distortion_weight=0.01
  go fruit_s6_d01 40 60 $FRUIT seed=6 model.distortion_weight=0.01
  if [ $MLP_RC = 0 ]; then
    go lego_bf16 40 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
    go lego_16 40 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=16-mixed
    go fox_bf16 40 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
    RATE=$(cat $R/rate.txt 2>/dev/null || echo 300)
    timeout -k 10 150 python3 -m nerf_lightning.bench.curve --checkpoints 60 --rate $RATE --tolerance 1 --out $R/c60 -- $LEGO precision=bf16-mixed > $R/c60.log 2>&1
    echo "c60 bf16 rc=$?" >> $OUT/rows.txt; tail -4 $R/c60.log >> $OUT/rows.txt; cp $R/c60/curve.json $OUT/c60_bf16.json 2>/dev/null
    el "c60"
  fi ) &
wait
el "all done"; cat $OUT/rows.txt
