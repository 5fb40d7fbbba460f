#!/usr/bin/env bash
# shellcheck disable=SC2086
# The viewer's numbers on one GPU (nvidia-h200; docs/viewer.md): lego trained twice with the same
# overrides, viewer=off and viewer=on with a client orbiting an 800x800 canvas the whole time
# (steps/s of both), then frames/s of the viewer=on run's checkpoint (~60 s of training) at 800x800
# and at the preview resolution (256). About 4 minutes. viser is not on the GPU machine: add its
# wheels to .whl (scripts/gpu/README.md), installed by the usual prefix of the call.
set -u
R=/tmp/rviewer; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
LEGO="experiment=blender data.path=.devdata/lego logger=csv callbacks.progress_bar=null trainer.max_steps=20000"
timeout -k 10 540 python3 -m nerf_lightning.bench.viewer --sizes 800,256 --frames 30 --out $R -- $LEGO \
    > $R/bench.log 2>&1
echo "bench rc=$?" >> "$OUT/rows.txt"
grep -A8 "^viewer benchmark" $R/bench.log >> "$OUT/rows.txt" || tail -30 $R/bench.log >> "$OUT/rows.txt"
cp $R/viewer_bench.json "$OUT/" 2>/dev/null
el "viewer bench"
