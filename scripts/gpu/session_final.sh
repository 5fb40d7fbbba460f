#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists ($C, $v) are split into words on purpose
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 110 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; el build
timeout 60 python3 -m pytest -q -m cuda tests -p no:cacheprovider 2>&1 | tail -4; el tests
C="logger=csv callbacks.progress_bar=null callbacks.model_checkpoint=null trainer.check_val_every_n_epoch=100000"
timeout 120 python3 -m nerf_lightning.train experiment=blender data.path=.devdata/lego $C trainer.max_steps=20000 hydra.run.dir=/tmp/l20k > /tmp/l20k.log 2>&1; el lego20k
for v in "default" "small model.field.encoding.n_levels=8 model.field.encoding.log2_hashmap_size=15 model.field.encoding.max_resolution=512"; do
  set -- $v; name=$1; shift
  timeout 50 python3 -m nerf_lightning.train data.path=.devdata/fruit $C trainer.max_steps=2000 "$@" hydra.run.dir=/tmp/fruit_$name > /tmp/fruit_$name.log 2>&1; el fruit_$name
done
cp /tmp/fruit_default/val/*.png $OUT/ 2>/dev/null; cp /tmp/fruit_small/val/*.png $OUT/fruit_small_panel.png 2>/dev/null
for d in /tmp/l20k /tmp/fruit_default /tmp/fruit_small; do python3 -c "
import json,sys; m=json.load(open('$d/metrics.json')); print('$d', m['steps'], round(m['time/train_s'],1), 'psnr', round(m['val/psnr'],3), 'Mrays/s', round(m['train/rays_per_s']/1e6,2), 'occ', round(m.get('model/occupied_fraction',-1),3))" 2>/dev/null || tail -3 $d.log; done
