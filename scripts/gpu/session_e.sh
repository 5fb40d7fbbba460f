#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists are split into words on purpose
# x2 session, call 2 of 3 (2026-11-30, second device session): FSDP end to end after the post-fit fix
# (32 / bf16-mixed / 16-mixed), FSDP checkpoints evaluated under strategy=single and resumed after
# kill -9, memory per GPU at log2_hashmap_size 22 and 24 (DDP vs FSDP), 1 GPU vs 2 GPUs with
# data.batch_scaling=global (time to PSNR), and render speed at 800x800 from call 1's lego checkpoint.
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
D=$PWD/.devout; R=$D/r; mkdir -p "$R"
[ -d .torch_extensions ] || { tar xzf .devdata/ext.tgz; find .torch_extensions -type f -exec touch {} +; }
timeout 150 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
LEGO="experiment=blender data.path=.devdata/lego logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000 callbacks.last_checkpoint.every_n_train_steps=500"
summary() {
python3 - "$R" <<'PY'
import json, glob, os, sys
rows = []
for d in sorted(glob.glob(sys.argv[1] + "/*/metrics.json")):
    m = json.load(open(d)); n = d.split("/")[-2]
    rows.append((n, m.get("steps"), m.get("time/train_s"), m.get("val/psnr"), m.get("train/rays_per_s"), m.get("train/samples_per_s"), m.get("gpu/mem_peak_gb"), m.get("gpu/utilization_mean")))
json.dump(rows, open(os.environ["OUT"] + "/e.json", "w"), indent=1)
print(f"{'run':18s} {'steps':>6s} {'train_s':>8s} {'psnr':>6s} {'Mrays/s':>8s} {'Msmp/s':>7s} {'memGB':>6s} {'gpu%':>5s}")
for r in rows:
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"
    print(f"{r[0]:18s} {f(r[1],'%6d')} {f(r[2],'%8.2f')} {f(r[3],'%6.2f')} {f(r[4] and r[4]/1e6,'%8.2f')} {f(r[5] and r[5]/1e6,'%7.1f')} {f(r[6],'%6.2f')} {f(r[7],'%5.0f')}")
PY
}
run() { name=$1; shift; timeout "${TO:-90}" python3 -m nerf_lightning.train $LEGO "$@" hydra.run.dir="$R/$name" > "$R/$name.log" 2>&1 || { echo "FAIL $name"; grep -iE "error|exception" "$R/$name.log" | tail -4; }; el "$name"; }
evaluate() { name=$1; shift; timeout 90 python3 -m nerf_lightning.eval ckpt="$R/$name" hydra.run.dir="$D/eval_$name" "$@" > "$D/eval_$name.log" 2>&1 || echo "FAIL eval $name"; tail -2 "$D/eval_$name.log"; el "eval $name"; }
TO=130 run fsdp2_32 strategy=fsdp devices=2 trainer.max_steps=1000
CUDA_VISIBLE_DEVICES=0 evaluate fsdp2_32 &
TO=70 run mem_fsdp2_24 strategy=fsdp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=24 callbacks.last_checkpoint=null callbacks.model_checkpoint=null
wait
TO=70 run mem_ddp2_22 strategy=ddp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=22 callbacks.last_checkpoint=null callbacks.model_checkpoint=null
TO=70 run mem_fsdp2_22 strategy=fsdp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=22 callbacks.last_checkpoint=null callbacks.model_checkpoint=null
CUDA_VISIBLE_DEVICES=0 TO=70 run g1_3000 trainer.max_steps=3000
TO=70 run g2glob_3000 strategy=ddp devices=2 trainer.max_steps=3000 data.batch_scaling=global
TO=100 run fsdp2_bf16 strategy=fsdp devices=2 trainer.max_steps=1000 precision=bf16-mixed
CUDA_VISIBLE_DEVICES=0 evaluate fsdp2_bf16 &
CUDA_VISIBLE_DEVICES=1 evaluate g2glob_3000 &
wait
TO=100 run fsdp2_16 strategy=fsdp devices=2 trainer.max_steps=1000 precision=16-mixed
# FSDP resume: kill -9 the whole process group once a checkpoint exists, then the same command with ckpt_path=last
( setsid python3 -m nerf_lightning.train $LEGO strategy=fsdp devices=2 trainer.max_steps=1500 hydra.run.dir="$R/fsdp2_resume" > "$R/fsdp2_resume.log" 2>&1 & echo $! > "$D/pgid"; wait ) &
for _ in $(seq 1 90); do sleep 1; [ -f "$R/fsdp2_resume/checkpoints/last.ckpt" ] && break; done; sleep 2
kill -9 -- "-$(cat "$D/pgid")" 2>/dev/null; wait; el "killed fsdp2_resume"
python3 -c "import torch; c=torch.load('$R/fsdp2_resume/checkpoints/last.ckpt', weights_only=True, map_location='cpu'); print('fsdp last.ckpt after kill: step', c['global_step'])" | tee "$OUT/fsdp_resume.txt"
TO=100 run fsdp2_resume strategy=fsdp devices=2 trainer.max_steps=1500 ckpt_path=last
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m nerf_lightning.render ckpt="$D/l20k" camera_path=orbit frames=120 width=800 height=800 \
    hydra.run.dir="$D/render" > "$D/render.log" 2>&1; tail -1 "$D/render.log"; el render
cp "$D/render/render.json" "$OUT/" 2>/dev/null; cp "$D"/eval_*/metrics.json "$OUT/" 2>/dev/null
for f in "$D"/eval_*; do [ -f "$f/metrics.json" ] && cp "$f/metrics.json" "$OUT/$(basename "$f").json"; done
for f in "$R"/*.log; do tail -30 "$f" > "$OUT/$(basename "$f").tail"; done
summary
