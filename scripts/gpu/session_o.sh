#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fourth device session, call O (nvidia-h200-x2; 2026-11-30), issue 8 after the second fusion round
# (gradients aliased to the backward graph's buffers, no input copies, background composited in the
# rendering kernels, fused density activation). GPU0: the lego 300 s point; GPU1: CUDA tests, the
# census per precision, fixed-step quality (lego, fox), the 60 s point. Both run side by side.
set -u
R=/tmp/ro; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
rm -rf .torch_extensions
timeout -k 5 200 python3 -m nerf_lightning.ops._ext > $R/build.log 2>&1; tail -1 $R/build.log >> $OUT/rows.txt
tar czf $OUT/ext.tgz .torch_extensions
el "ext built"
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
( export CUDA_VISIBLE_DEVICES=0
  timeout -k 10 420 python3 -m nerf_lightning.bench.curve --checkpoints 300 --rate 255 --tolerance 1 --out $R/c300 -- $LEGO > $R/c300.log 2>&1
  echo "c300 rc=$?" >> $OUT/rows.txt; tail -4 $R/c300.log >> $OUT/rows.txt; cp $R/c300/curve.json $OUT/c300.json 2>/dev/null
  el "c300" ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout -k 10 150 python3 -m pytest -q -m cuda tests -p no:cacheprovider > $R/cuda_tests.log 2>&1
  echo "cuda tests rc=$?: $(tail -1 $R/cuda_tests.log)" >> $OUT/rows.txt
  grep -E "^(FAILED|ERROR)" $R/cuda_tests.log | head -20 >> $OUT/rows.txt
  el "cuda tests"
  for prec in 32-true bf16-mixed 16-mixed; do
    timeout -k 10 100 python3 scripts/gpu/census.py $prec > $R/census_$prec.log 2>&1
    { echo "== census $prec"; grep -A40 "^census" $R/census_$prec.log | head -50; } >> $OUT/census.txt
    grep "^census\|^timeline" $R/census_$prec.log | sed "s/^/$prec: /" >> $OUT/rows.txt
    el "census $prec"
  done
  run lego_s1 80 $LEGO $C trainer.max_steps=5000 seed=1
  run fox_s1 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1
  timeout -k 10 130 python3 -m nerf_lightning.bench.curve --checkpoints 60 --rate 265 --tolerance 1 --out $R/c60 -- $LEGO > $R/c60.log 2>&1
  echo "c60 rc=$?" >> $OUT/rows.txt; tail -4 $R/c60.log >> $OUT/rows.txt; cp $R/c60/curve.json $OUT/c60.json 2>/dev/null
  el "c60" ) &
wait
el "all done"; cat $OUT/rows.txt
