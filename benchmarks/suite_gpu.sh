#!/usr/bin/env bash
# The benchmark runner (python -m benchmarks.suite) on a GPU machine without network or an installed Hydra:
# the set-up of benchmarks/gpu_common.sh (the carried wheels to /tmp/site, this checkout's sources first on
# the path, the CUDA extension's cache unpacked), then the runner, its results in $OUT (the folder that
# comes back).
#
#   bash benchmarks/suite_gpu.sh cuda-tests lego-curve --limit 540
#   bash benchmarks/suite_gpu.sh cuda-tests --rebuild-extension --pack-extension --limit 300
#
# Carry from the repository root: .whl/ (the wheels of ../shared/device-wheels), .devdata/{lego,fox,fruit}
# (copies of ../shared/data/*) and .devdata/ext.tgz (OUT/ext.tgz of an earlier --pack-extension run); for the
# peers-* experiments also .peers/ (../shared/peers without its two *-src.tar.gz: instant-ngp's build).
# Every argument goes to the runner; see `python -m benchmarks.suite --help`. WHEELS and PYTHON as in
# gpu_common.sh; OUT (default outputs/bench/suite/latest) and WORK (/tmp/nerf_bench) are the runner's
# --out and --work.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh
gpu_wheels || exit 2
OUT=${OUT:-$PWD/outputs/bench/suite/latest}
exec "$PY" -m benchmarks.suite --out "$OUT" --work "${WORK:-/tmp/nerf_bench}" "$@"
