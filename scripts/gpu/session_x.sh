#!/usr/bin/env bash
# shellcheck disable=SC2086,SC2030,SC2031
# Sixth device session, call X (nvidia-h200, one GPU, alone; 2026-12-01): lego's 300 s point
# (issue 8) with near-camera gradient scaling (the new default) and a 2^20 hash table: a 3000-step
# calibration run for the step rate, then bench.curve --checkpoints 300; the 15 s point if time is left.
set -u
R=/tmp/rx; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv model.field.encoding.log2_hashmap_size=20"
run cal 60 $LEGO $C trainer.max_steps=3000 seed=1
read -r RATE OK < <(python3 -c "import json; m=json.load(open('$R/cal/metrics.json')); print(round(0.97*m['steps']/m['time/train_s']), int(m['val/psnr'] >= 33.0))" 2>/dev/null || echo "280 0")
echo "calibrated rate $RATE ok=$OK" >> $OUT/rows.txt
timeout -k 10 390 python3 -m nerf_lightning.bench.curve --checkpoints 300 --rate $RATE --tolerance 1 --out $R/c300 -- $LEGO > $R/c300.log 2>&1
echo "c300 rc=$?" >> $OUT/rows.txt; tail -4 $R/c300.log >> $OUT/rows.txt; cp $R/c300/curve.json $OUT/c300.json 2>/dev/null
el "c300"
if [ "$(left)" -gt 45 ]; then
  timeout -k 5 40 python3 -m nerf_lightning.bench.curve --checkpoints 15 --rate $RATE --tolerance 1 --out $R/c15 -- $LEGO > $R/c15.log 2>&1
  echo "c15 rc=$?" >> $OUT/rows.txt; tail -4 $R/c15.log >> $OUT/rows.txt; cp $R/c15/curve.json $OUT/c15.json 2>/dev/null
fi
el "all done"; cat $OUT/rows.txt
