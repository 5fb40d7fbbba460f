#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists are split into words on purpose
# x2 session, call 3: FSDP with a traceback on hang (SIGABRT + faulthandler), DDP bf16 checkpoint evaluated
# under strategy=single, lego 3000 steps -> eval + render speed at 800x800.
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
R=/tmp/rf; mkdir -p "$R"
timeout -k 5 100 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
LEGO="experiment=blender data.path=.devdata/lego logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000 callbacks.last_checkpoint.every_n_train_steps=500"
run() { name=$1; to=$2; shift 2; timeout -s ABRT -k 10 "$to" python3 -m nerf_lightning.train $LEGO "$@" hydra.run.dir="$R/$name" > "$R/$name.log" 2>&1; echo "rc=$? $name"; el "$name"; }
evaluate() { name=$1; timeout -k 5 60 python3 -m nerf_lightning.eval ckpt="$R/$name" hydra.run.dir="$R/eval_$name" > "$R/eval_$name.log" 2>&1; echo "rc=$? eval $name"; tail -2 "$R/eval_$name.log"; }
run fsdp2_300 75 strategy=fsdp devices=2 trainer.max_steps=300
pkill -9 -f nerf_lightning.train; sleep 1
grep -n "Current thread\|File \"/work\|File \"/tmp/site/lightning\|Error\|error" "$R/fsdp2_300.log" | head -40
tail -5 "$R/fsdp2_300.log"
CUDA_VISIBLE_DEVICES=0 run g1_3000 60 trainer.max_steps=3000 &
CUDA_VISIBLE_DEVICES=1 run g1_bf16_1000 60 trainer.max_steps=1000 precision=bf16-mixed &
wait
run ddp2_bf16_1000 70 strategy=ddp devices=2 trainer.max_steps=1000 precision=bf16-mixed
pkill -9 -f nerf_lightning.train
CUDA_VISIBLE_DEVICES=0 evaluate g1_3000 &
CUDA_VISIBLE_DEVICES=1 evaluate ddp2_bf16_1000 &
wait
CUDA_VISIBLE_DEVICES=0 timeout -k 5 90 python3 -m nerf_lightning.render ckpt="$R/g1_3000" camera_path=orbit frames=120 width=800 height=800 \
    hydra.run.dir="$R/render" > "$R/render.log" 2>&1; echo "rc=$? render"; tail -2 "$R/render.log"; el render
cp "$R/render/render.json" "$OUT/" 2>/dev/null
for f in "$R"/*.log; do tail -60 "$f" > "$OUT/$(basename "$f").tail"; done
for d in "$R"/*/metrics.json; do n=$(basename "$(dirname "$d")"); cp "$d" "$OUT/$n.metrics.json"; python3 -c "
import json; m=json.load(open('$d')); print('$n', {k: (round(v,3) if isinstance(v,float) else v) for k,v in m.items() if k in ('steps','time/train_s','val/psnr','train/rays_per_s','gpu/mem_peak_gb')})"; done
