#!/usr/bin/env bash
# The Dockerfile's ahead-of-time build, checked on a GPU machine without Docker: build the extension for
# sm_80/86/89/90 with no GPU check (as `docker build` does), confirm the four architectures are in the
# library, then load it in a fresh process the way a container starts (same environment): it must not
# compile again, and the self-check must pass on the GPU.
#
#   bash scripts/docker/check_aot_build.sh            # PYTHON=python3, a fresh TORCH_EXTENSIONS_DIR
set -euo pipefail

PY=${PYTHON:-python3}
export TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0"   # = the Dockerfile's ARG
TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(mktemp -d)/torch_extensions}
export TORCH_EXTENSIONS_DIR
log=$(mktemp -d)

echo "[aot] build (no GPU check) into $TORCH_EXTENSIONS_DIR"
"$PY" -m nerf_lightning.ops._ext --no-check 2>&1 | tee "$log/build.txt"

lib=$(find "$TORCH_EXTENSIONS_DIR" -name 'nerf_lightning_cuda*.so' | head -n 1)
[[ -n $lib ]] || { echo "[aot] FAIL: no library built"; exit 1; }
CUOBJDUMP=${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump
command -v "$CUOBJDUMP" >/dev/null || CUOBJDUMP=cuobjdump
"$CUOBJDUMP" --list-elf "$lib" | tee "$log/elf.txt"
for sm in sm_80 sm_86 sm_89 sm_90; do
    grep -q "$sm" "$log/elf.txt" || { echo "[aot] FAIL: $sm missing from $lib"; exit 1; }
done

echo "[aot] container start: load the cached build and self-check on the GPU"
start=$(date +%s)
"$PY" -m nerf_lightning.ops._ext 2>&1 | tee "$log/start.txt"
if grep -q "building the CUDA extension" "$log/start.txt"; then
    echo "[aot] FAIL: the extension was compiled again at start"; exit 1
fi
grep -q "is_available(): True" "$log/start.txt" || { echo "[aot] FAIL: self-check"; exit 1; }
echo "[aot] PASS: sm_80 sm_86 sm_89 sm_90 in $(basename "$lib"); start-up load $(( $(date +%s) - start )) s"
