#!/usr/bin/env bash
# One batched GPU-machine session (see BENCHMARKS.md): CUDA tests, a GPU training run on the default
# scene, the data-path benchmark on fox, and the sampler A/B. Each part is time-boxed; results land in $OUT.
# Expects an ignored .devdata/ folder (carried to the GPU machine) holding copies of the data:
#   .devdata/fox (../shared/data/fox), .devdata/scenes/default-v1 (outputs/scenes/default-v1) and
#   .devdata/scenes/default-hard16 (python -c "from nerf_lightning.bench.sampler_ab import hard_scene;
#   from pathlib import Path; hard_scene(Path('.devdata/scenes'), 16)").
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
timeout 130 python3 -m pytest -q -m cuda tests/ -p no:cacheprovider 2>&1 | tail -4 | tee "$OUT/cuda_tests.txt"
timeout 150 python3 -m nerf_lightning.train data.path=.devdata/scenes/default-v1 trainer.max_steps=${GPU_STEPS:-4000} \
    logger=csv callbacks.progress_bar=null hydra.run.dir=/tmp/gpu_run 2>&1 | tail -3
cp /tmp/gpu_run/metrics.json "$OUT/gpu_train_metrics.json" 2>/dev/null
cp "$(ls /tmp/gpu_run/val/*.png | tail -1)" "$OUT/gpu_val_panel.png" 2>/dev/null
timeout 80 python3 -m nerf_lightning.bench.data --path .devdata/fox --downscale 1 --steps 100 2>&1 | tail -14 | tee "$OUT/data_bench.txt"
timeout ${AB_TIMEOUT:-200} python3 -m nerf_lightning.bench.sampler_ab --scene .devdata/scenes/default-hard16 \
    --scene .devdata/fox --seeds 0 1 2 --steps ${AB_STEPS:-1500} --out "$OUT/sampler_ab.json" 2>&1 | tail -12 | tee "$OUT/ab.txt"
