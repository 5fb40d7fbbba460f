#!/usr/bin/env bash
# GPU checks of issue 10 (BENCHMARKS.md, "Resume, eval, render"): the resume PSNR comparison (a run killed
# with SIGKILL and continued with ckpt_path=last against an uninterrupted one), eval reproducing the
# run's val/psnr, render speed at 800x800 and a mesh export. Results land in $OUT.
# Expects .devdata/scenes/default-v1 (see gpu_session.sh), PYTHONPATH with src/ and the device wheels, and
# imageio-ffmpeg, trimesh, PyMCubes among them (the device machine has no network).
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/i10; rm -rf "$W"; mkdir -p "$W"
ARGS="data.path=.devdata/scenes/default-v1 trainer.max_steps=${STEPS:-4000} logger=csv callbacks.progress_bar=null
      callbacks.last_checkpoint.every_n_train_steps=${EVERY:-500}"
# 1. uninterrupted reference (also builds the CUDA extension on first use)
timeout 240 python3 -m nerf_lightning.train $ARGS hydra.run.dir=$W/ref 2>&1 | tail -2
# 2. the same command killed with SIGKILL after KILL_AFTER s, then the same command with ckpt_path=last
timeout -s KILL ${KILL_AFTER:-35} python3 -m nerf_lightning.train $ARGS hydra.run.dir=$W/res > $W/killed.log 2>&1
python3 -c "import torch; print('killed; last.ckpt at step', torch.load('$W/res/checkpoints/last.ckpt',
  weights_only=True)['global_step'])" | tee "$OUT/resume.txt"
timeout 240 python3 -m nerf_lightning.train $ARGS hydra.run.dir=$W/res ckpt_path=last 2>&1 | tail -2
grep -H '"val/psnr"\|"steps"' $W/ref/metrics.json $W/res/metrics.json | tee -a "$OUT/resume.txt"
# 3. eval of the reference checkpoint: same val/psnr as its metrics.json
timeout 90 python3 -m nerf_lightning.eval ckpt=$W/ref hydra.run.dir=$W/eval 2>&1 | tail -2 | tee "$OUT/eval.txt"
# 4. render speed: 120 frames of 800x800 (render.json: render_fps excludes the video encoding)
timeout 240 python3 -m nerf_lightning.render ckpt=$W/ref camera_path=orbit frames=120 width=800 height=800 \
    hydra.run.dir=$W/render 2>&1 | tail -1 | tee "$OUT/render.txt"
cp $W/render/render.json "$OUT/render.json"; cp $W/render/rgb.mp4 $W/render/depth.mp4 "$OUT/" 2>/dev/null
timeout 180 python3 -m nerf_lightning.render ckpt=$W/ref camera_path=orbit frames=120 width=800 height=800 \
    chunk=262144 depth=false hydra.run.dir=$W/render_big 2>&1 | tail -1 | tee -a "$OUT/render.txt"
# 5. mesh
timeout 180 python3 -m nerf_lightning.export mesh ckpt=$W/ref resolution=512 hydra.run.dir=$W/mesh 2>&1 \
    | tail -1 | tee "$OUT/mesh.txt"
