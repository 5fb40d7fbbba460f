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
build_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
( export CUDA_VISIBLE_DEVICES=1
  cuda_tests mlp_tests 100 -x tests/ops/test_fused_mlp_cuda.py
  census 80 32-true bf16-mixed 16-mixed
  cuda_tests cuda_tests 150 -m cuda tests
  el "cuda tests" ) &
( export CUDA_VISIBLE_DEVICES=0
  go lego_bf16 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go lego_16 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=16-mixed
  go lego_bf16_torch 60 80 $LEGO $C trainer.max_steps=5000 seed=1 precision=bf16-mixed model.field.mlp_backend=torch
  go fox_bf16 60 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=bf16-mixed
  go fox_16 60 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 precision=16-mixed ) &
wait
el "all done"; cat $OUT/rows.txt
