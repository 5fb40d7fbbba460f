#!/usr/bin/env bash
# shellcheck disable=SC2086
# Seventh device session, call AA (nvidia-h200, one GPU, alone; 2026-12-01): lego's time points
# (issue 8) with experiment=blender as landed now (pixel centres over the evaluation background, from
# calls Y and Z). One bench.curve run per point; the 15 s run starts from a guessed rate (call T's
# 15 s run measured 325 steps/s; RATE overrides it), each later run uses the rate its predecessor
# measured. R (the run folder) and RATE make it reusable: session_ac.sh.
set -u
R=${R:-/tmp/raa}; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv"
timeout -k 10 ${CURVE_TIMEOUT:-500} python3 -m nerf_lightning.bench.curve --checkpoints 15,60,300 --rate ${RATE:-320} \
    --tolerance 1 --out $R/curve -- $LEGO > $R/curve.log 2>&1
echo "curve rc=$?" >> $OUT/rows.txt
tail -10 $R/curve.log >> $OUT/rows.txt
tail -25 $R/curve.log > $OUT/curve_tail.txt
cp $R/curve/curve.json $OUT/curve.json 2>/dev/null; cp $R/curve/curve.png $OUT/curve.png 2>/dev/null
el "all done"; cat $OUT/rows.txt
