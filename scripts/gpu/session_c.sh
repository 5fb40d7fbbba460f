#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists ($LEGO, $OUT paths) are split into words on purpose
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 240 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
timeout 100 python3 -m nerf_lightning.bench.curve --checkpoints 15 --rate 200 --profile-steps 40 --out $OUT/c15 -- $LEGO 2>&1 | grep -v Warning | tail -5; el c15
python3 - <<'PY'
import json, os
p = json.load(open(os.environ["OUT"] + "/c15/curve.json"))["points"][0]["profile"]
print({k: round(v, 3) for k, v in p.items() if not isinstance(v, (dict, list))}, p["syncs_per_step"])
for t, c, n in p["top_host_ops_ms_per_step"][:14]: print(f"  host {t:.3f} ms x{c} {n}")
PY
for prec in 32 bf16-mixed 16-mixed; do
  timeout 80 python3 -m nerf_lightning.train $LEGO precision=$prec trainer.max_steps=3000 trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null callbacks.progress_bar=null hydra.run.dir=/tmp/p$prec > /tmp/p$prec.log 2>&1
  python3 -c "import json;m=json.load(open('/tmp/p$prec/metrics.json'));print('prec $prec', m['steps'], round(m['time/train_s'],2), 'steps/s', round(m['steps']/m['time/train_s'],1), 'psnr', round(m['val/psnr'],3), 'Mrays/s', round(m['train/rays_per_s']/1e6,2))" || tail -5 /tmp/p$prec.log
done; el prec
timeout 150 python3 -m nerf_lightning.bench.curve --checkpoints 60 --rate 250 --out $OUT/c60 -- $LEGO 2>&1 | grep -v Warning | tail -3; el c60
