#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031,SC2012  # override lists split into words on purpose; per-GPU subshells; png names are ours
# Third device session, call 1 (nvidia-h200-x2; 2026-11-30): measurements of landed main.
#   GPU 0: CUDA tests; lego curve at 60 s with a step profile (issue 8: wall/kernel after the batch
#          graph); 32 / bf16-mixed / 16-mixed at 15 s with profiles (mixed precision); fox 20k steps.
#   GPU 1: lego curve at 300 s (issue 8's third point).
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.txt"; }
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout -k 5 150 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
curve() { name=$1; to=$2; shift 2; timeout -k 10 "$to" python3 -m nerf_lightning.bench.curve --out "/tmp/$name" "$@" > "/tmp/$name.log" 2>&1; rc=$?; cp "/tmp/$name/curve.json" "$OUT/$name.json" 2>/dev/null
          echo "rc=$rc $name" >> "$OUT/rows.txt"; grep '^\[curve\]' "/tmp/$name.log" >> "$OUT/rows.txt"; tail -5 "/tmp/$name.log" > "$OUT/$name.tail"; el "$name"; }
( export CUDA_VISIBLE_DEVICES=1
  curve c300 420 --checkpoints 300 --rate 235 --tolerance 1 -- $LEGO ) &
( export CUDA_VISIBLE_DEVICES=0
  timeout -k 5 150 python3 -m pytest -q -m cuda tests -p no:cacheprovider > /tmp/cuda_tests.log 2>&1
  echo "rc=$? cuda tests: $(tail -1 /tmp/cuda_tests.log)" >> "$OUT/rows.txt"; grep -E "FAILED|Error" /tmp/cuda_tests.log | head -20 >> "$OUT/rows.txt"; el tests
  curve c60 140 --checkpoints 60 --rate 240 --tolerance 1 --profile-steps 40 -- $LEGO
  curve p32 60 --checkpoints 15 --rate 230 --tolerance 1 --profile-steps 40 -- $LEGO
  curve pbf16 60 --checkpoints 15 --rate 230 --tolerance 1 --profile-steps 40 -- $LEGO precision=bf16-mixed
  curve p16 60 --checkpoints 15 --rate 230 --tolerance 1 --profile-steps 40 -- $LEGO precision=16-mixed
  timeout -k 10 150 python3 -m nerf_lightning.train data.path=.devdata/fox logger=csv callbacks.progress_bar=null trainer.max_steps=20000 \
      trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null callbacks.last_checkpoint=null hydra.run.dir=/tmp/fox20k > /tmp/fox20k.log 2>&1
  echo "rc=$? fox20k: $(python3 -c "import json;m=json.load(open('/tmp/fox20k/metrics.json'));print({k:m.get(k) for k in ('steps','time/train_s','val/psnr','val/ssim','train/rays_per_s')})" 2>&1 | tail -1)" >> "$OUT/rows.txt"; el fox20k ) &
wait
python3 - <<'PY' >> "$OUT/rows.txt"
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    for p in json.load(open(f)).get("points", []):
        pr = p.get("profile", {})
        g = pr.get("groups_ms_per_step", {})
        print(f"{f.split('/')[-1][:-5]:6s} T={p['checkpoint_s']:g} ran={p['train_s']:.1f}s steps={p['steps']} psnr={p['psnr']} sps={p['steps_per_s']:.1f} "
              f"wall={pr.get('wall_ms_per_step', 0):.2f} kern={pr.get('kernel_ms_per_step', 0):.2f} ratio={pr.get('wall_over_kernel', 0):.2f} "
              + " ".join(f"{k}={v:.2f}" for k, v in g.items()) + f" syncs={pr.get('syncs_per_step')}")
        if pr: print("  host:", pr.get("top_host_ops_ms_per_step", [])[:12])
PY
el "all done"; cat "$OUT/rows.txt"
