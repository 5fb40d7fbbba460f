#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031  # override lists split into words on purpose; per-GPU subshells
# x2 session, last call (2026-11-30, second device session), in priority order, results written to
# $OUT as they come (the call may be cut by the session's device budget):
#   1. FSDP end to end after the evaluation fix: in-fit and post-fit validation, eval of its checkpoint
#      under strategy=single, resume from its last.ckpt (issues 10, 11)
#   2. side by side on one GPU each: hash-grid layout A/B on lego and fruit, fox at 5000 steps (issue 9)
#   3. peak memory per GPU, DDP vs FSDP, log2_hashmap_size 24 and 22 (issue 11)
#   4. FSDP bf16-mixed / 16-mixed at equal steps (issue 11)
#   5. 1 GPU vs 2 GPUs with data.batch_scaling=global (issue 11)
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.txt"; }
R=/tmp/rg; mkdir -p "$R"
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout -k 5 150 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
C="logger=csv callbacks.progress_bar=null"
LEGO="experiment=blender data.path=.devdata/lego $C trainer.check_val_every_n_epoch=100000"
NOCKPT="callbacks.last_checkpoint=null callbacks.model_checkpoint=null"
row() {  # one line per finished run, appended to $OUT/rows.txt
python3 - "$1" "$2" <<'PY' | tee -a "$OUT/rows.txt"
import json, sys
name, d = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(d + "/metrics.json"))
except Exception as e:
    print(f"{name:16s} no metrics.json ({type(e).__name__})"); sys.exit()
g = lambda k, s=1.0, f="%.2f": (f % (m[k] / s)) if isinstance(m.get(k), (int, float)) else "-"
print(f"{name:16s} steps {g('steps', f='%d'):>6s} train_s {g('time/train_s'):>7s} psnr {g('val/psnr', f='%.3f'):>7s} "
      f"ssim {g('val/ssim', f='%.4f')} eval {g('eval/psnr', f='%.3f')} Mrays/s {g('train/rays_per_s', 1e6)} "
      f"Msmp/s {g('train/samples_per_s', 1e6, '%.1f')} memGB {g('gpu/mem_peak_gb', f='%.3f')} gpu% {g('gpu/utilization_mean', f='%.0f')}")
PY
}
run() { name=$1; to=$2; shift 2; timeout -k 10 "$to" python3 -m nerf_lightning.train "$@" hydra.run.dir="$R/$name" > "$R/$name.log" 2>&1
        echo "rc=$? $name" >> "$OUT/rows.txt"; tail -40 "$R/$name.log" > "$OUT/$name.log.tail"; row "$name" "$R/$name"; el "$name"; }
# 1. FSDP end to end
run fsdp2_32 110 $LEGO strategy=fsdp devices=2 trainer.max_steps=500 data.steps_per_epoch=250 trainer.check_val_every_n_epoch=1
( CUDA_VISIBLE_DEVICES=0 timeout -k 5 60 python3 -m nerf_lightning.eval ckpt="$R/fsdp2_32" hydra.run.dir="$R/eval_fsdp2_32" > "$R/eval.log" 2>&1
  echo "rc=$? eval fsdp2_32: $(grep -h 'test/psnr\|val/psnr' "$R/eval.log" | tail -1)" >> "$OUT/rows.txt" ) &
run fsdp2_resume 90 $LEGO strategy=fsdp devices=2 trainer.max_steps=700 data.steps_per_epoch=250 ckpt_path="$R/fsdp2_32/checkpoints/last.ckpt"
grep -h "resuming\|Restored\|restor" "$R/fsdp2_resume.log" | head -3 >> "$OUT/rows.txt"
wait
# 2. one GPU each: the hash grid's layout at equal size (16 x 2 features, instant-ngp's paper; 8 x 4;
#    6 x 8, instant-ngp's configs/nerf/base.json today) on lego (5000 steps) and fruit (2000 steps)
G8="model.field.encoding.n_levels=8 model.field.encoding.n_features_per_level=4"
G6="model.field.encoding.n_levels=6 model.field.encoding.n_features_per_level=8"
( export CUDA_VISIBLE_DEVICES=0
  run lego_16x2 60 $LEGO $NOCKPT trainer.max_steps=5000
  run lego_8x4 60 $LEGO $NOCKPT trainer.max_steps=5000 $G8
  run lego_6x8 60 $LEGO $NOCKPT trainer.max_steps=5000 $G6 ) &
( export CUDA_VISIBLE_DEVICES=1
  F="data.path=.devdata/fruit $C $NOCKPT trainer.max_steps=2000 trainer.check_val_every_n_epoch=100000"
  run fruit_16x2 50 $F
  run fruit_8x4 50 $F $G8
  cp "$R"/fruit_8x4/val/*.png "$OUT/" 2>/dev/null
  run fruit_6x8 50 $F $G6
  run fox_5000 60 data.path=.devdata/fox $C $NOCKPT trainer.max_steps=5000 trainer.check_val_every_n_epoch=100000 ) &
wait
# 3. memory
run mem_fsdp2_24 60 $LEGO $NOCKPT strategy=fsdp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=24
run mem_ddp2_24 60 $LEGO $NOCKPT strategy=ddp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=24
run mem_fsdp2_22 60 $LEGO $NOCKPT strategy=fsdp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=22
# 4. FSDP precision at equal steps (against fsdp2_32's 500 steps)
run fsdp2_bf16 70 $LEGO $NOCKPT strategy=fsdp devices=2 trainer.max_steps=500 precision=bf16-mixed
run fsdp2_16 70 $LEGO $NOCKPT strategy=fsdp devices=2 trainer.max_steps=500 precision=16-mixed
# 5. time to PSNR: 1 GPU vs 2 GPUs sharing the global batch
CUDA_VISIBLE_DEVICES=0 run g1_3000 50 $LEGO $NOCKPT trainer.max_steps=3000
run g2glob_3000 60 $LEGO $NOCKPT strategy=ddp devices=2 trainer.max_steps=3000 data.batch_scaling=global
el "all done"; cat "$OUT/rows.txt"
