#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012  # override lists split into words on purpose; per-GPU subshells; png names are ours
# Third device session, call 2 (nvidia-h200-x2; 2026-11-30):
#   GPU 0: CUDA tests (the cached-extension loader); step census fp32 / bf16 (issue 8: where the
#          wall/kernel gap goes); lego 5000 steps, default grid vs 8 levels, seeds 1-3 (issue 9)
#   GPU 1: fruit 2000 steps and fox 5000 steps, default grid vs 8 levels, seeds 1-3 (issue 9)
#   both:  lego 3000 steps on 1 GPU vs 2 GPUs sharing the global batch (issue 11, time to target)
set -u
R=/tmp/ri; mkdir -p $R
# shellcheck disable=SC1091  # sourced from the repository root
source scripts/gpu/lib.sh
load_extension
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pwd >> "$OUT/progress.txt"
LEGO="experiment=blender data.path=.devdata/lego $C"
L8="model.field.encoding.n_levels=8"
( export CUDA_VISIBLE_DEVICES=0
  timeout -k 5 120 python3 -m pytest -q -m cuda tests -p no:cacheprovider > $R/cuda_tests.log 2>&1
  echo "rc=$? cuda tests: $(tail -1 $R/cuda_tests.log)" >> "$OUT/rows.txt"; grep -E "^FAILED" $R/cuda_tests.log | head >> "$OUT/rows.txt"; el tests
  for p in 32-true bf16-mixed; do timeout -k 5 90 python3 scripts/gpu/census.py $p > $R/census_$p.log 2>&1; echo "rc=$? census $p" >> "$OUT/census.txt"; grep -v Warning $R/census_$p.log | tail -34 >> "$OUT/census.txt"; el census $p; done
  for s in 1 2 3; do run lego_16x2_s$s 60 $LEGO trainer.max_steps=5000 seed=$s; run lego_8x2_s$s 60 $LEGO trainer.max_steps=5000 seed=$s $L8; done ) &
( export CUDA_VISIBLE_DEVICES=1
  F="data.path=.devdata/fruit $C trainer.max_steps=2000"
  X="data.path=.devdata/fox $C trainer.max_steps=5000"
  for s in 1 2 3; do run fruit_16x2_s$s 45 $F seed=$s; run fruit_8x2_s$s 45 $F seed=$s $L8; done
  for s in 1 2 3; do run fox_16x2_s$s 60 $X seed=$s; run fox_8x2_s$s 60 $X seed=$s $L8; done ) &
wait
CUDA_VISIBLE_DEVICES=0 run g1_3000 50 $LEGO trainer.max_steps=3000
run g2glob_3000 70 $LEGO strategy=ddp devices=2 trainer.max_steps=3000 data.batch_scaling=global
el "all done"; cat "$OUT/census.txt" "$OUT/rows.txt"
