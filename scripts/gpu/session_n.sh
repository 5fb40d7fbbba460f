#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Fourth device session, call N (nvidia-h200-x2; 2026-11-30), issue 8: the fused step ops
# (masked loss, ray count, sample points, box normalization, fixed layout / repack kernels, full-fp32
# camera rays). The new tree travels as .devdata/new_{src,tests,scripts} (main's src is the old one),
# so the census runs the old and the new step on the same GPU in one call. GPU1 runs the CUDA tests.
set -u
R=/tmp/rn; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
OLD=$PWD/src NEW=$PWD/.devdata/new_src
rm -rf .torch_extensions .torch_ext_old; tar xzf .devdata/ext.tgz && mv .torch_extensions .torch_ext_old
el "old ext: $(ls .torch_ext_old)"
# new build (its own cache; returned as ext.tgz for the next call)
rm -rf .torch_extensions
PYTHONPATH=/tmp/site:$NEW timeout -k 5 240 python3 -m nerf_lightning.ops._ext > $R/build.log 2>&1; tail -2 $R/build.log >> $OUT/rows.txt
tar czf $OUT/ext.tgz .torch_extensions
el "new ext built"
( export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site:$NEW
  timeout -k 10 300 python3 -m pytest -q -m cuda .devdata/new_tests -p no:cacheprovider > $R/cuda_tests.log 2>&1
  echo "cuda tests rc=$?: $(tail -1 $R/cuda_tests.log)" >> $OUT/rows.txt
  grep -E "^(FAILED|ERROR)|Error" $R/cuda_tests.log | head -20 >> $OUT/rows.txt
  el "cuda tests"
  # quality check of the new step at fixed steps (seed 1 before: 34.785 dB)
  run lego_new_s1 80 experiment=blender data.path=.devdata/lego $C trainer.max_steps=5000 seed=1 ) &
export CUDA_VISIBLE_DEVICES=0
for v in old new; do
  if [ $v = old ]; then P=$OLD X=$PWD/.torch_ext_old; else P=$NEW X=$PWD/.torch_extensions; fi
  for prec in 32-true bf16-mixed; do
    PYTHONPATH=/tmp/site:$P TORCH_EXTENSIONS_DIR=$X timeout -k 10 150 python3 .devdata/new_scripts/census.py $prec > $R/census_${v}_$prec.log 2>&1
    { echo "== census $v $prec"; grep -A60 "^census" $R/census_${v}_$prec.log | head -70; } >> $OUT/census.txt
    grep "^census\|^timeline" $R/census_${v}_$prec.log | sed "s/^/$v $prec: /" >> $OUT/rows.txt
    el "census $v $prec"
  done
done
wait
el "all done"; cat $OUT/rows.txt
