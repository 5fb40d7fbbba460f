#!/usr/bin/env bash
# shellcheck disable=SC2086
# Prepared in the seventh session (2026-12-01) for the next device session; not run yet.
# nvidia-h200, one GPU, alone: lego's time points (issue 8) after last.ckpt moved to a 60 s cadence
# (it was written every 1000 steps, ~96 times in call AA's 300 s run) and the step statistics were
# detached. bench.curve now records a steps/s + GPU-utilization timeline per run (curve.json).
# The 15 s run starts from call AA's measured rate; each later run uses its predecessor's.
set -u
R=/tmp/rac; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
timeout -k 10 ${CURVE_TIMEOUT:-500} python3 -m nerf_lightning.bench.curve --checkpoints 15,60,300 --rate 330 \
    --tolerance 1 --out $R/curve -- $LEGO > $R/curve.log 2>&1
echo "curve rc=$?" >> $OUT/rows.txt
tail -10 $R/curve.log >> $OUT/rows.txt
cp $R/curve/curve.json $OUT/curve.json 2>/dev/null; cp $R/curve/curve.png $OUT/curve.png 2>/dev/null
el "all done"; cat $OUT/rows.txt
