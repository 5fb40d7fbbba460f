#!/usr/bin/env bash
# shellcheck disable=SC2086
# Side by side with instant-ngp on one H200 (issue 24, goals 1 and 5): the same views, both metrics,
# each program alone on the GPU. One call per part (each under the 10-minute command limit):
#   bash scripts/gpu/session_peers.sh fox     # ~7 min: instant-ngp 15/60 s and 60 s with train
#                                             #   extrinsics, nerf_lightning 15/60 s, per-view table
#   bash scripts/gpu/session_peers.sh fruit   # ~7.5 min: instant-ngp 15/60 s, nerf_lightning 15/60 s;
#                                             #   the Blender-layout copy: nerf_lightning 60 s with auto
#                                             #   (photo recipe) and with the render recipe forced
#   bash scripts/gpu/session_peers.sh lego    # ~5 min: both programs at 15/60 s
#   TIMES=15,60,300 bash scripts/gpu/session_peers.sh lego   # ~16 min: split it over two calls
# Needs, in the repository root: .whl (the Hydra wheels, installed as in every session), .devdata/
# {lego,fox,fruit} (+ ext.tgz), and .peers/ = a copy of ../shared/peers without the two *-src tarballs
# (README.md, run_scene.sh, ngp_eval.py, ingp-bin.tar.xz.part00/01: 16 MB); the bench extracts
# ingp-bin into .peers/instant-ngp on first use. Results: $OUT/peers_<scene>.md (the table),
# $OUT/peers_<scene>.json (every number, per view), $OUT/progress.txt; logs of failed runs in fails.txt.
set -u
PART=${1:?usage: session_peers.sh fox|fruit|lego}
TIMES=${TIMES:-15,60}
R=/tmp/rpeers; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
B="python3 -m nerf_lightning.bench.peers --out $R --times $TIMES"
keep() {  # keep SCENE_DIR_NAME: the table and the numbers of one scene -> $OUT
    cp "$R/$1/peers.md" "$OUT/peers_$1.md" 2>/dev/null
    cp "$R/$1/peers.json" "$OUT/peers_$1.json" 2>/dev/null
    for log in "$R/$1"/logs/*.log; do
        grep -qE "Traceback|error:|FATAL" "$log" 2>/dev/null && { echo "=== $log"; tail -25 "$log"; } >> "$OUT/fails.txt"
    done
}
case $PART in
fox)
    $B --scene fox --programs ngp; el "fox ngp"
    $B --scene fox --programs ngp --times 60 --ngp-train-extrinsics; el "fox ngp extrinsics"
    $B --scene fox --programs ours; el "fox ours"
    keep fox ;;
fruit)
    $B --scene fruit; el "fruit both"
    keep fruit
    # the same views as Blender split files (opaque photographs, fl_x/cx/k1..p2, aabb_scale 32): the
    # recipe now follows the images (auto = photo); before, auto followed the layout (= render recipe)
    $B --scene fruit --layout blender --programs ours --times 60; el "fruit-blender auto"
    $B --scene fruit --layout blender --programs ours --times 60 --label before-fix -- \
        data.pixel_jitter=false data.train_background=eval; el "fruit-blender before"
    keep fruit-blender ;;  # its table holds instant-ngp's fruit runs: the same split files
lego)
    $B --scene lego; el "lego both"
    keep lego ;;
*) echo "unknown part $PART" >&2; exit 2 ;;
esac
el "done"
cat "$OUT"/peers_*.md
