#!/usr/bin/env bash
# shellcheck disable=SC2086
# `process` on fox's 50 photos, then fox trained 20k steps on the recovered poses and on the
# transforms.json that ships with fox (the same recipe and seeds): held-out PSNR within 0.5 dB.
# Expects .devdata/fox (a copy of ../shared/data/fox) and pycolmap importable (carry its cp312
# wheel, e.g. `pip download pycolmap==4.2.1 --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux_2_28_x86_64 -d .whl`). With FOX_SFM=DIR set to a capture made elsewhere
# (its transforms.json; the images are linked from .devdata/fox), the structure from motion is
# skipped. Two lanes share the GPU (fixed steps: no speed number is reported).
set -u
R=/tmp/rpf; mkdir -p $R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
load_extension
SFM=$R/fox_sfm
if [ -n "${FOX_SFM:-}" ]; then
    mkdir -p $SFM && cp "$FOX_SFM/transforms.json" $SFM/ && ln -sfn "$PWD/.devdata/fox/images" $SFM/images
    echo "sfm: carried from $FOX_SFM" >> $OUT/rows.txt
else
    /usr/bin/time -f "sfm wall %e s, cpu %P" python3 -m nerf_lightning.process \
        images=.devdata/fox/images out=$SFM hydra.run.dir=$R/process > $R/process.log 2>&1
    tail -9 $R/process.log >> $OUT/rows.txt
    cp $SFM/process.json $OUT/ 2>/dev/null
fi
el sfm
FOX="$C trainer.max_steps=20000"
lane() {
    local s=$1
    go fox_shipped_s$s 150 300 data.path=.devdata/fox $FOX seed=$s
    go fox_sfm_s$s 150 300 data.path=$SFM $FOX seed=$s
}
( lane 1 ) & ( lane 2 ) &
wait
# the recovered capture with the shipped box size (aabb_scale 4), one seed
go fox_sfm_aabb4_s1 150 300 data.path=$SFM data.aabb_scale=4 $FOX seed=1
el "all done"; cat $OUT/rows.txt
