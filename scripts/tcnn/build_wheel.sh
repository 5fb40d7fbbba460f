#!/usr/bin/env bash
# Build the tinycudann wheel (tiny-cuda-nn's PyTorch binding) offline, for one GPU architecture.
#
#   bash scripts/tcnn/build_wheel.sh [TARBALL]
#
# TARBALL: tiny-cuda-nn's sources with their dependencies (default: $TCNN_SRC, else
# .peers/tcnn-src.tar.gz, else ../shared/peers/tcnn-src.tar.gz). Needs nvcc, ninja and torch with
# CUDA in the python3 on PATH; no network (pip wheel --no-index --no-build-isolation).
#
# Environment:
#   ARCH       compute capability to build for (90: H100/H200; 80: A100; 86: RTX 30xx; 89: RTX 40xx)
#   JOBS       parallel compile jobs (default: nproc)
#   OUT        folder for the wheel (default: .whl); a wheel over 15 MiB is also split into .partNN
#   WORK       scratch folder (default: /tmp/tcnn-build); the sources are unpacked there, never here
#   NETWORKS   1: also build tcnn's networks (FullyFusedMLP, CUTLASS); default 0: only the encodings,
#              all nerf_lightning uses (model.backend=tcnn), in a third of the time
#   TRIM_GRID  1 (default): compile the grid encoding for 3-D inputs only (NeRF's); 0: all dimensions
#   RTC        1: keep tcnn's runtime kernel fusion (needs nvrtc.h and libnvrtc); default 0
#   PATCH_ONLY 1: unpack and patch, print the patched lines, stop (a dry run: no GPU, no compiler)
#
# The patches (the same text on every run, each checked to apply):
#   - setup.py imports parse_version from pkg_resources, which setuptools >= 82 no longer ships: a
#     one-line version parser instead (it only compares CUDA versions; needs no packaging module);
#   (setup.py's C++17 stays: the binding compiles against torch's headers as C++17, checked with
#   torch 2.13's; tcnn's sources compile with nvcc 13.0 for sm_90, checked without a GPU)
#   - bytes_to_string formats with snprintf instead of an ostringstream (why: at the patch below);
#   - NETWORKS / TRIM_GRID / RTC above.
# Prints the wheel's path last; writes build.log beside the wheel. On the GPU machine (16 cores, sm_90):
#   ARCH=90 OUT=$OUT bash scripts/tcnn/build_wheel.sh .peers/tcnn-src.tar.gz
# then keep the wheel in .whl/, where benchmarks/suite_gpu.sh installs it from.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
tarball=${1:-${TCNN_SRC:-}}
if [ -z "$tarball" ]; then
    for candidate in "$repo/.peers/tcnn-src.tar.gz" "$repo/../shared/peers/tcnn-src.tar.gz"; do
        if [ -f "$candidate" ]; then tarball=$candidate; break; fi
    done
fi
[ -n "$tarball" ] && [ -f "$tarball" ] || { echo "error: tcnn-src.tar.gz not found (pass it, or set TCNN_SRC)" >&2; exit 2; }
ARCH=${ARCH:-90}
JOBS=${JOBS:-$(nproc)}
OUT=${OUT:-$repo/.whl}
WORK=${WORK:-/tmp/tcnn-build}
NETWORKS=${NETWORKS:-0}
TRIM_GRID=${TRIM_GRID:-1}
RTC=${RTC:-0}
PY=${PYTHON:-python3}
command -v nvcc >/dev/null || { echo "error: nvcc not on PATH (set PATH to the CUDA toolkit's bin)" >&2; exit 2; }
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
export CUDA_HOME
mkdir -p "$OUT"
log="$OUT/build.log"
: > "$log"
say() { echo "[tcnn $(date +%T)] $*" | tee -a "$log" >&2; }

rm -rf "$WORK" && mkdir -p "$WORK"
tar -xzf "$tarball" -C "$WORK"
root="$WORK/tiny-cuda-nn"
setup="$root/bindings/torch/setup.py"
[ -f "$setup" ] || { echo "error: $tarball holds no tiny-cuda-nn/bindings/torch/setup.py" >&2; exit 2; }
say "sources $(cut -c1-60 "$root/ANCHOR_COMMITS.txt" | head -1) from $tarball"

# patch FILE SED_EXPRESSION GREP_AFTER: apply one edit and check that it took
patch_file() {
    sed -i -E "$2" "$1"
    grep -qE "$3" "$1" || { echo "error: patch '$2' did not apply to $1" >&2; exit 3; }
}
patch_file "$setup" 's/^from pkg_resources import parse_version$/def parse_version(v): return tuple(int(x) for x in re.findall(r"\\d+", str(v)))/' \
    '^def parse_version\(v\): return tuple'
# bytes_to_string (every workspace allocation logs its size through it) formats with an ostringstream.
# A toolchain whose g++ links libstdc++ statically into the binding (the GPU machine's CXX, /opt/gcc:
# the .so then needs no libstdc++.so) runs a second copy of libstdc++ beside the one torch loaded; its
# stream locale is never set up and the first tcnn.Encoding forward segfaults inside that ostream.
# snprintf formats the same text ("%.3g": 3 significant digits, as precision(3)) without iostreams.
"$PY" - "$root/include/tiny-cuda-nn/common_host.h" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
old = '\tstd::ostringstream oss;\n\toss.precision(3);\n\toss << count << " " << suffixes[i];\n\treturn oss.str();'
new = ('\tchar text[64];\n\tstd::snprintf(text, sizeof(text), "%.3g %s", count, suffixes[i].c_str());\n'
       '\treturn std::string{text};')
if old not in text:
    sys.exit(f"error: bytes_to_string's ostringstream body not found in {path}")  # exit status 1
open(path, "w").write(text.replace(old, new))
PATCH
if [ "$NETWORKS" = 0 ]; then
    patch_file "$setup" 's/^include_networks = True$/include_networks = False/' '^include_networks = False$'
fi
if [ "$RTC" = 0 ]; then
    patch_file "$setup" 's/^\t"-DTCNN_RTC",$//; s/libraries=\["cuda", "nvrtc"\]/libraries=["cuda"]/' 'libraries=\["cuda"\]'
    # Without TCNN_RTC, src/rtc_kernel.cu stubs CudaRtcKernel's constructor (it throws) but not set(),
    # which rtc_kernel.h's launch() calls: the binding then fails to import (undefined symbol
    # tcnn::CudaRtcKernel::set). A stub that throws like the constructor (never reached: no kernel exists).
    patch_file "$root/src/rtc_kernel.cu" \
        's/^void CudaRtcKernel::clear\(\) \{\}$/void CudaRtcKernel::clear() {}\nvoid CudaRtcKernel::set(CUfunction_attribute, int) { throw std::runtime_error{"tiny-cuda-nn was not compiled with runtime compilation (RTC) support."}; }/' \
        '^void CudaRtcKernel::set\(CUfunction_attribute, int\)'
fi
if [ "$TRIM_GRID" = 1 ]; then
    grid="$root/include/tiny-cuda-nn/encodings/grid.h"
    patch_file "$grid" 's@^(\t\tcase [24]: return new GridEncodingTemplated<T, [24], N_FEATURES_PER_LEVEL, HASH_TYPE>)@\t\t// 3-D only: \1@' \
        '// 3-D only: .*case 4:'
fi
say "patched: parse_version, bytes_to_string, NETWORKS=$NETWORKS TRIM_GRID=$TRIM_GRID RTC=$RTC"
if [ "${PATCH_ONLY:-0}" = 1 ]; then
    grep -nE "def parse_version|base_cflags = |^include_networks|libraries=|TCNN_RTC\"" "$setup" | tee -a "$log"
    grep -n "3-D only" "$root/include/tiny-cuda-nn/encodings/grid.h" | tee -a "$log" || true
    grep -n "CudaRtcKernel::set" "$root/src/rtc_kernel.cu" | tee -a "$log" || true
    grep -n "std::snprintf(text" "$root/include/tiny-cuda-nn/common_host.h" | tee -a "$log"
    exit 0
fi

# libcuda for the link: the toolkit's stub (the driver's own library is only needed at run time)
export LIBRARY_PATH="$CUDA_HOME/lib64/stubs:$CUDA_HOME/lib64${LIBRARY_PATH:+:$LIBRARY_PATH}"
py_bin=$(dirname "$(command -v "$PY")")
export PATH="$CUDA_HOME/bin:$py_bin:$PATH"
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$log" >&2
start=$(date +%s)
(
    cd "$root/bindings/torch"
    TCNN_CUDA_ARCHITECTURES=$ARCH MAX_JOBS=$JOBS "$PY" -m pip wheel . --no-build-isolation --no-deps --no-index \
        -w "$WORK/dist"
) >> "$log" 2>&1 || { grep -nE "error|Error" "$log" | grep -v "Werror\|error_\|_error\|errors.h" | head -20 >&2; exit 1; }
wheels=("$WORK"/dist/tinycudann-*.whl)
wheel=${wheels[0]}
cp "$wheel" "$OUT/"
wheel="$OUT/$(basename "$wheel")"
size=$(stat -c %s "$wheel")
if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15M -d -a 2 "$wheel" "$wheel.part"
    parts=("$wheel".part*)
    say "split into ${#parts[@]} parts: cat $(basename "$wheel").part* > $(basename "$wheel")"
fi
say "built in $(( $(date +%s) - start )) s: $wheel ($((size / 1024)) KiB)"
echo "$wheel"
