#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fifth device session, call R (nvidia-h200-x2; 2026-11-30): the fused half-precision MLP kernels
# (ops/csrc/mlp.cu), written without a GPU. GPU1: their CUDA tests, then all CUDA tests, then the
# census per precision. GPU0: lego/fox at 5k steps under bf16-mixed and 16-mixed (fused MLP) and
# bf16-mixed with the torch layers (model.field.mlp_backend=torch), against call Q's fp32 rows.
set -u
R=/tmp/rr; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
rm -rf .torch_extensions
timeout -k 5 240 python3 -m nerf_lightning.ops._ext > $R/build.log 2>&1; tail -1 $R/build.log >> $OUT/rows.txt
grep -iE "error" $R/build.log | head -20 >> $OUT/rows.txt
tar czf $OUT/ext.tgz .torch_extensions
el "ext built"
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
( export CUDA_VISIBLE_DEVICES=1
  timeout -k 10 100 python3 -m pytest -q -x tests/ops/test_fused_mlp_cuda.py -p no:cacheprovider > $R/mlp_tests.log 2>&1
  echo "mlp tests rc=$?: $(tail -1 $R/mlp_tests.log)" >> $OUT/rows.txt
  grep -E "^(FAILED|ERROR|E  )" $R/mlp_tests.log | head -30 >> $OUT/rows.txt
  el "mlp tests"
  for prec in 32-true bf16-mixed 16-mixed; do
    timeout -k 10 80 python3 scripts/gpu/census.py $prec > $R/census_$prec.log 2>&1
    { echo "== census $prec"; grep -A40 "^census" $R/census_$prec.log | head -50; } >> $OUT/census.txt
    grep "^census\|^timeline" $R/census_$prec.log | sed "s/^/$prec: /" >> $OUT/rows.txt
    el "census $prec"
  done
  timeout -k 10 150 python3 -m pytest -q -m cuda tests -p no:cacheprovider > $R/cuda_tests.log 2>&1
  echo "cuda tests rc=$?: $(tail -1 $R/cuda_tests.log)" >> $OUT/rows.txt
  grep -E "^(FAILED|ERROR)" $R/cuda_tests.log | head -20 >> $OUT/rows.txt
  el "cuda tests" ) &
( export CUDA_VISIBLE_DEVICES=0
  go lego_bf16 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go lego_16 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=16-mixed
  go lego_bf16_torch 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed model.field.mlp_backend=torch
  go fox_bf16 60 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go fox_16 60 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=16-mixed ) &
wait
el "all done"; cat $OUT/rows.txt
