#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists are split into words on purpose
# x2 session, call 1 of 3 (2026-11-30, second device session). Both GPUs run single-GPU jobs side by
# side; the CPU builds the Docker image's ahead-of-time extension meanwhile.
#   GPU0: `make bench`-style lego curve at 60 s and 300 s with a profile (issue 8)
#   GPU1: all CUDA tests, lego 20k steps with the per-image metric (issue 9), fruit grid factors one at a
#         time (issue 9)
#   CPU : scripts/docker/check_aot_build.sh (issue 12)
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
D=$PWD/.devout; mkdir -p "$D"
nvidia-smi -L
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 200 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; tar czf "$OUT/ext.tgz" .torch_extensions; el build
( MAX_JOBS=6 TORCH_EXTENSIONS_DIR=/tmp/aot/torch_extensions timeout 450 bash scripts/docker/check_aot_build.sh > "$D/aot.log" 2>&1; echo "rc=$?" >> "$D/aot.log" ) &
( CUDA_VISIBLE_DEVICES=0 timeout 480 python3 -m nerf_lightning.bench.curve --checkpoints 60,300 --rate 215 --tolerance 0.5 \
    --profile-steps 30 --out "$D/curve" -- experiment=blender data.path=.devdata/lego > "$D/curve.log" 2>&1; el curve ) &
C="logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000"
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 120 python3 -m pytest -q -m cuda tests -p no:cacheprovider > "$D/cuda_tests.log" 2>&1; tail -3 "$D/cuda_tests.log"; el tests
  timeout 150 python3 -m nerf_lightning.train experiment=blender data.path=.devdata/lego $C trainer.max_steps=20000 \
      hydra.run.dir="$D/l20k" > "$D/l20k.log" 2>&1; el lego20k
  timeout 200 python3 -m nerf_lightning.bench.capture_ab --path .devdata/fruit --steps 2000 --variants res_512,table_15,levels_8 \
      --out "$D/fruit_ab" > "$D/fruit_ab.log" 2>&1; el fruit_ab
) &
wait; el all
cp "$D"/curve/*.json "$D"/curve/*.png "$OUT/" 2>/dev/null; cp "$D"/fruit_ab/*.json "$OUT/" 2>/dev/null
cp "$D/l20k/metrics.json" "$OUT/l20k_metrics.json" 2>/dev/null
for f in aot curve cuda_tests l20k fruit_ab; do tail -25 "$D/$f.log" > "$OUT/$f.tail"; done
echo "== AOT"; tail -4 "$D/aot.log"
echo "== CUDA tests"; tail -2 "$D/cuda_tests.log"
echo "== curve"; tail -12 "$D/curve.log"
echo "== fruit"; tail -8 "$D/fruit_ab.log"
echo "== lego 20k"; python3 -c "
import json; m=json.load(open('$D/l20k/metrics.json')); print({k: m.get(k) for k in ('steps','time/train_s','val/psnr','val/ssim','test/psnr','train/rays_per_s')})" || tail -5 "$D/l20k.log"
