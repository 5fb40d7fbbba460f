#!/usr/bin/env bash
# The benchmark runner (python -m benchmarks.suite) on a GPU machine without network or an
# installed Hydra: the carried wheels go to /tmp/site, this checkout's sources come first on the path, the
# CUDA extension is cached in .torch_extensions, and the results land in $OUT (the folder that comes back).
#
#   bash scripts/bench/gpu_suite.sh cuda-tests lego-curve --limit 540
#   bash scripts/bench/gpu_suite.sh cuda-tests --rebuild-extension --pack-extension --limit 300
#
# Carry from the repository root: .whl/ (the wheels of ../shared/device-wheels), .devdata/{lego,fox,fruit}
# (copies of ../shared/data/*) and .devdata/ext.tgz (OUT/ext.tgz of an earlier --pack-extension run); for the
# peers-* experiments also .peers/ (../shared/peers without its two *-src.tar.gz: instant-ngp's build).
# Every argument goes to the runner; see `python -m benchmarks.suite --help`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
OUT=${OUT:-$PWD/outputs/bench/suite/latest}
exec "$PY" -m benchmarks.suite --out "$OUT" --work "${WORK:-/tmp/nerf_bench}" "$@"
