#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# For the branch issue8-fused-rays (fused sampler and training rays, written without a GPU): build,
# all CUDA tests (the branch's new ones: tests/data/test_rays_cuda.py and
# test_sampler.py::test_sample_kernel_equals_the_torch_path_on_cuda), the census per precision and
# lego/fox at 5k steps. Merge the branch only if the tests pass and PSNR holds (lego s1 ~34.7 dB).
set -u
R=/tmp/rp; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
rm -rf .torch_extensions
timeout -k 5 200 python3 -m nerf_lightning.ops._ext > $R/build.log 2>&1; tail -1 $R/build.log >> $OUT/rows.txt
tar czf $OUT/ext.tgz .torch_extensions
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
( export CUDA_VISIBLE_DEVICES=1
  timeout -k 10 150 python3 -m pytest -q -m cuda tests -p no:cacheprovider > $R/cuda_tests.log 2>&1
  echo "cuda tests rc=$?: $(tail -1 $R/cuda_tests.log)" >> $OUT/rows.txt
  grep -E "^(FAILED|ERROR)" $R/cuda_tests.log | head -20 >> $OUT/rows.txt
  run lego_s1 80 $LEGO $C trainer.max_steps=5000 seed=1
  run fox_s1 80 data.path=.devdata/fox $C trainer.max_steps=5000 seed=1 ) &
( export CUDA_VISIBLE_DEVICES=0
  for prec in 32-true bf16-mixed 16-mixed; do
    timeout -k 10 100 python3 scripts/gpu/census.py $prec > $R/census_$prec.log 2>&1
    { echo "== census $prec"; grep -A40 "^census" $R/census_$prec.log | head -50; } >> $OUT/census.txt
    grep "^census\|^timeline" $R/census_$prec.log | sed "s/^/$prec: /" >> $OUT/rows.txt
  done ) &
wait
cat $OUT/rows.txt
