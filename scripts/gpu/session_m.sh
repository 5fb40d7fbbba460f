#!/usr/bin/env bash
# shellcheck disable=SC2030,SC2031,SC2086  # override lists split into words on purpose
# Fourth device session, call M (nvidia-h200-x2), issue 11: what session_g.sh left unrun.
# Order (cheap, unconfirmed first; skipped when its expected duration would cross LIMIT seconds):
#   1. FSDP checkpoint (lego, 2 GPUs, 500 steps, session_g's overrides, checkpoints on) evaluated
#      under strategy=single (python -m nerf_lightning.eval), GPU 0; fox 1 GPU 3000 steps on GPU 1
#      beside the eval (the fox baseline of part 4)
#   2. DDP peak memory per GPU at log2_hashmap_size=22 (200 steps, as the 19/24 table)
#   3. fox DDP 2 GPUs 3000 steps
#   4. FSDP lego 3000 steps at 32 / bf16-mixed / 16-mixed
#   5. fox FSDP 2 GPUs 3000 steps (1000 steps for rays/s alone when 3000 do not fit)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/rm; mkdir -p $R
# shellcheck disable=SC1091  # sourced from the repository root
source scripts/gpu/lib.sh
LIMIT=${LIMIT:-400}
load_extension
NOCKPT="callbacks.model_checkpoint=null callbacks.last_checkpoint=null"
LEGO="experiment=blender data.path=.devdata/lego logger=csv callbacks.progress_bar=null"
FOX="data.path=.devdata/fox $C trainer.max_steps=3000"
# 1. FSDP checkpoint -> eval under strategy=single (session_g.sh's fsdp2_32 overrides)
go fsdp2_ckpt 40 110 $LEGO strategy=fsdp devices=2 trainer.max_steps=500 data.steps_per_epoch=250 trainer.check_val_every_n_epoch=1
ls -la "$R/fsdp2_ckpt/checkpoints" >> "$OUT/rows.txt" 2>&1
( export CUDA_VISIBLE_DEVICES=0
  if [ -f "$R/fsdp2_ckpt/checkpoints/last.ckpt" ]; then
    timeout -k 5 90 python3 -m nerf_lightning.eval ckpt="$R/fsdp2_ckpt" strategy=single hydra.run.dir="$R/eval_fsdp2_ckpt" > "$R/eval.log" 2>&1
    rc=$?
    python3 - "$rc" "$R/eval_fsdp2_ckpt/metrics.json" <<'PY' >> "$OUT/rows.txt"
import json, sys
try:
    m = json.load(open(sys.argv[2]))
    ks = {k: v for k, v in m.items() if isinstance(v, float)}
    print(f"eval_fsdp2_ckpt    rc={sys.argv[1]} step {m.get('step')} split {m.get('split')} views {m.get('n_views')} " + " ".join(f"{k} {v:.4f}" for k, v in ks.items()))
except Exception as e:
    print(f"eval_fsdp2_ckpt    rc={sys.argv[1]} no metrics.json ({type(e).__name__})")
PY
    [ -f "$R/eval_fsdp2_ckpt/metrics.json" ] || { echo "=== eval_fsdp2_ckpt"; tail -25 "$R/eval.log"; } >> "$OUT/fails.txt"
  else echo "eval_fsdp2_ckpt    no last.ckpt" >> "$OUT/rows.txt"; fi
  el eval ) &
( export CUDA_VISIBLE_DEVICES=1; go fox1_3000 45 80 $FOX ) &
wait
# 2. memory, DDP, 2^22
go mem_ddp2_22 30 70 $LEGO $NOCKPT trainer.check_val_every_n_epoch=100000 strategy=ddp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=22
# 3. fox DDP
go fox_ddp2_3000 45 90 $FOX strategy=ddp devices=2
# 4. FSDP precision, lego 3000 steps
L3="$LEGO $NOCKPT trainer.check_val_every_n_epoch=100000 strategy=fsdp devices=2 trainer.max_steps=3000"
go fsdp2_32_3000 85 140 $L3
go fsdp2_bf16_3000 85 140 $L3 precision=bf16-mixed
go fsdp2_16_3000 85 140 $L3 precision=16-mixed
# 5. fox FSDP
if [ "$(left)" -ge 110 ]; then go fox_fsdp2_3000 110 170 $FOX strategy=fsdp devices=2
else go fox_fsdp2_1000 55 90 data.path=.devdata/fox $C trainer.max_steps=1000 strategy=fsdp devices=2; fi
el "all done"; cat "$OUT/rows.txt"; cat "$OUT/fails.txt" 2>/dev/null
