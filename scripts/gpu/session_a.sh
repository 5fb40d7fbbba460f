#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists ($LEGO, $OUT paths) are split into words on purpose
# GPU session A: build, CUDA tests, first lego profile (new budgeted default vs the fixed-ray path).
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi -L
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 240 python3 -m nerf_lightning.ops._ext 2>&1 | tail -3
tar czf $OUT/ext.tgz .torch_extensions; el build
timeout 200 python3 -m pytest -q -x -m cuda tests/ops/test_cuda_fixed.py tests/ops/test_cuda_ops.py -p no:cacheprovider 2>&1 | tail -15; el tests
timeout 110 python3 -m nerf_lightning.bench.curve --checkpoints 12 --rate 250 --tolerance 1 --profile-steps 40 --out $OUT/new -- experiment=blender data.path=.devdata/lego logger=csv 2>&1 | grep -v Warning | tail -12; el new
timeout 100 python3 -m nerf_lightning.bench.curve --checkpoints 12 --rate 100 --tolerance 1 --profile-steps 40 --out $OUT/old -- experiment=blender data.path=.devdata/lego logger=csv model.sample_budget=null data.batch_size=8192 2>&1 | grep -v Warning | tail -12; el old
