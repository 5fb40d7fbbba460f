#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012  # override lists split into words on purpose; per-GPU subshells; png names are ours
# Third device session, call 2 (nvidia-h200-x2; 2026-11-30):
#   GPU 0: CUDA tests (the cached-extension loader); step census fp32 / bf16 (issue 8: where the
#          wall/kernel gap goes); lego 5000 steps, default grid vs 8 levels, seeds 1-3 (issue 9)
#   GPU 1: fruit 2000 steps and fox 5000 steps, default grid vs 8 levels, seeds 1-3 (issue 9)
#   both:  lego 3000 steps on 1 GPU vs 2 GPUs sharing the global batch (issue 11, time to target)
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*" >> "$OUT/progress.txt"; }
pwd >> "$OUT/progress.txt"
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz; fi
timeout -k 5 150 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
C="logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null callbacks.last_checkpoint=null"
LEGO="experiment=blender data.path=.devdata/lego $C"
L8="model.field.encoding.n_levels=8"
R=/tmp/ri; mkdir -p $R
row() { python3 - "$1" "$2" <<'PY' >> "$OUT/rows.txt"
import json, sys
name, d = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(d + "/metrics.json"))
except Exception as e:
    print(f"{name:18s} no metrics.json ({type(e).__name__})"); sys.exit()
g = lambda k, s=1.0, f="%.2f": (f % (m[k] / s)) if isinstance(m.get(k), (int, float)) else "-"
print(f"{name:18s} steps {g('steps', f='%d'):>6s} train_s {g('time/train_s'):>7s} psnr {g('val/psnr', f='%.3f'):>7s} "
      f"ssim {g('val/ssim', f='%.4f')} Mrays/s {g('train/rays_per_s', 1e6)} Msmp/s {g('train/samples_per_s', 1e6, '%.1f')} gpu% {g('gpu/utilization_mean', f='%.0f')}")
PY
}
run() { name=$1; to=$2; shift 2; timeout -k 10 "$to" python3 -m nerf_lightning.train "$@" hydra.run.dir="$R/$name" > "$R/$name.log" 2>&1
        rc=$?; [ $rc = 0 ] || { echo "rc=$rc $name"; tail -3 "$R/$name.log"; } >> "$OUT/rows.txt"; row "$name" "$R/$name"; el "$name"; }
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
