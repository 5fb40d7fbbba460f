#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fifth device session, call Q (nvidia-h200-x2; 2026-11-30): main with the branch issue8-fused-rays
# merged (fused training rays, the sampler's draw in one kernel, float4 SH stores), written without a
# GPU. GPU1: all CUDA tests, the census per precision. GPU0: fruit at the failing seeds with the
# distortion loss (issue 9), lego/fox 5k quality. Then both GPUs: FSDP bf16-mixed and 16-mixed with
# the fp32 parameter policy (issue 11).
set -u
R=/tmp/rq; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
export NCCL_NVLS_ENABLE=0
build_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
FRUIT="data.path=.devdata/fruit $C trainer.max_steps=2000"
( export CUDA_VISIBLE_DEVICES=1
  cuda_tests cuda_tests 150 -m cuda tests
  census 80 32-true bf16-mixed 16-mixed ) &
( export CUDA_VISIBLE_DEVICES=0
  go lego_s1 60 80 $LEGO $C trainer.max_steps=5000 seed=1
  go fox_s1 60 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1
  go fruit_s8 40 60 $FRUIT seed=8
  go fruit_s8_d01 40 60 $FRUIT seed=8 model.distortion_weight=0.01
  go fruit_s6_d01 40 60 $FRUIT seed=6 model.distortion_weight=0.01
  go fruit_s8_d001 40 60 $FRUIT seed=8 model.distortion_weight=0.001 ) &
wait
go fsdp_bf16 100 120 $LEGO $C strategy=fsdp devices=2 trainer.max_steps=3000 precision=bf16-mixed
go fsdp_16 100 120 $LEGO $C strategy=fsdp devices=2 trainer.max_steps=3000 precision=16-mixed
el "all done"; cat $OUT/rows.txt
