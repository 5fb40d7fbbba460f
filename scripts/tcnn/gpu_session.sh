#!/usr/bin/env bash
# tiny-cuda-nn on the GPU machine (issue: "tinycudann for real"), from the repository root, in three
# calls that each end well inside a call's 10 minutes. Results go to $OUT (rows.txt and the files named).
#
#   PHASE=build bash scripts/tcnn/gpu_session.sh
#       the tinycudann wheel for sm_90 from .peers/tcnn-src.tar.gz (scripts/tcnn/build_wheel.sh):
#       $OUT/tinycudann-*.whl (+ build.log); keep it as .whl/ for the next calls (about 4-7 min)
#   PHASE=test bash scripts/tcnn/gpu_session.sh
#       our extension (.devdata/ext.tgz when carried), then every CUDA test: `pytest -m cuda tests`,
#       the tcnn ones included; the tcnn tests' measured errors -> $OUT/tcnn_errors.txt (about 2 min)
#   PHASE=bench bash scripts/tcnn/gpu_session.sh
#       python -m nerf_lightning.bench.tcnn --lego .devdata/lego: the encoding at 2^18 / 2^20 points, the
#       training step, lego at 60 s per backend -> $OUT/tcnn_bench.md, tcnn_bench.json (about 6 min)
#
# Each call first installs the carried wheels: python3 -m pip install --no-index --no-deps --target
# /tmp/site .whl/*.whl, so a wheel built by PHASE=build and carried as .whl/ is importable.
set -u
OUT=${OUT:-$PWD/outputs/tcnn_session}
mkdir -p "$OUT"
R=/tmp/rtcnn
mkdir -p "$R"
export OUT R
# shellcheck disable=SC1091
source scripts/gpu/lib.sh
install_wheels() {
    if compgen -G ".whl/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    fi
    export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c 'from nerf_lightning.ops import tcnn; print("tinycudann:", tcnn.available() or "imports")' >> "$OUT/rows.txt" 2>&1
}
case "${PHASE:-}" in
build)
    OUT="$OUT" ARCH=90 timeout -k 10 560 bash scripts/tcnn/build_wheel.sh .peers/tcnn-src.tar.gz > "$R/wheel.txt" 2>&1
    echo "build rc=$?: $(tail -2 "$R/wheel.txt" | tr '\n' ' ')" >> "$OUT/rows.txt"
    wheel=$(tail -1 "$R/wheel.txt")
    if [ -f "$wheel" ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" >> "$OUT/rows.txt" 2>&1
        PYTHONPATH=/tmp/site:$PWD/src python3 -c 'import tinycudann, torch; print("import ok", torch.cuda.get_device_name())' >> "$OUT/rows.txt" 2>&1
    fi
    ;;
test)
    install_wheels
    load_extension
    cuda_tests cuda_tests 300 -m cuda tests -rs -s
    grep -E "^(pow2|ngp)|^SKIPPED|tcnn" "$R/cuda_tests.log" > "$OUT/tcnn_errors.txt"
    ;;
bench)
    install_wheels
    load_extension
    timeout -k 10 560 python3 -m nerf_lightning.bench.tcnn --lego .devdata/lego --out "$R/bench" \
        --markdown "$OUT/tcnn_bench.md" --json "$OUT/tcnn_bench.json" > "$R/bench.log" 2>&1
    echo "bench rc=$?" >> "$OUT/rows.txt"
    tail -30 "$R/bench.log" >> "$OUT/rows.txt"
    ;;
*)
    echo "PHASE must be build, test or bench" >&2
    exit 2
    ;;
esac
cat "$OUT/rows.txt"
