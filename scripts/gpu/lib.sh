#!/usr/bin/env bash
# Shared by the device session scripts (source it from the repository root after setting R, the
# folder for run directories and logs): the extension cache, a progress line, one results row per
# training run, and a time-boxed training run. Results go to $OUT/rows.txt (a call returns only a
# few files: keep one results file per call).
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*" >> "$OUT/progress.txt"; }
# The carried extension cache (a tar of .torch_extensions) loads in seconds when its stamp matches.
load_extension() {
    if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz; fi
    timeout -k 5 150 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1
    el build
}
# Training outputs of every run, without checkpoints or validation during training.
C="logger=csv callbacks.progress_bar=null trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null callbacks.last_checkpoint=null"
export C
row() {  # row NAME RUN_DIR: one line of metrics.json's numbers
python3 - "$1" "$2" <<'PY' >> "$OUT/rows.txt"
import json, sys
name, d = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(d + "/metrics.json"))
except Exception as e:
    print(f"{name:18s} no metrics.json ({type(e).__name__})"); sys.exit()
g = lambda k, s=1.0, f="%.2f": (f % (m[k] / s)) if isinstance(m.get(k), (int, float)) else "-"
sps = "%.1f" % (m["steps"] / m["time/train_s"]) if m.get("time/train_s") else "-"
print(f"{name:18s} steps {g('steps', f='%d'):>6s} train_s {g('time/train_s'):>7s} it/s {sps:>6s} psnr {g('val/psnr', f='%.3f'):>7s} ngp {g('val/psnr_ngp', f='%.3f'):>7s} "
      f"ssim {g('val/ssim', f='%.4f')} test {g('test/psnr', f='%.3f')} Mrays/s {g('train/rays_per_s', 1e6)} Msmp/s {g('train/samples_per_s', 1e6, '%.1f')} "
      f"memGB {g('gpu/mem_peak_gb', f='%.3f')} gpu% {g('gpu/utilization_mean', f='%.0f')} imb {g('perf/forward_imbalance')} wall_s {g('time/wall_s', f='%.0f')}")
PY
}
run() {  # run NAME SECONDS OVERRIDES...: train with a hard time box (Lightning traps SIGTERM: -k)
    local name=$1 to=$2 rc
    shift 2
    timeout -k 10 "$to" python3 -m nerf_lightning.train "$@" hydra.run.dir="$R/$name" > "$R/$name.log" 2>&1
    rc=$?
    [ $rc = 0 ] || { echo "rc=$rc $name"; tail -3 "$R/$name.log"; } >> "$OUT/rows.txt"
    row "$name" "$R/$name"
    el "$name"
}
# Seconds of script time left before LIMIT (default 480; a call has a fixed device budget).
left() { echo $(( ${LIMIT:-480} - $(date +%s) + T0 )); }
go() {  # go NAME EXPECTED_S TIMEOUT_S OVERRIDES...: `run` unless it would end past LIMIT; a failed run's log tail -> fails.txt
    local name=$1 exp=$2 to=$3
    shift 3
    if [ "$(left)" -lt "$exp" ]; then echo "$name skipped (time: $(left)s left)" >> "$OUT/rows.txt"; return; fi
    run "$name" "$to" "$@"
    [ -f "$R/$name/metrics.json" ] || { echo "=== $name"; tail -25 "$R/$name.log"; } >> "$OUT/fails.txt"
}
# A fresh build of the extension from this tree (its log's last line and errors -> rows.txt), and
# the build as $OUT/ext.tgz for the next call's .devdata/ext.tgz.
build_extension() {
    rm -rf .torch_extensions
    timeout -k 5 240 python3 -m nerf_lightning.ops._ext > "$R/build.log" 2>&1
    tail -1 "$R/build.log" >> "$OUT/rows.txt"
    grep -iE "error" "$R/build.log" | head -20 >> "$OUT/rows.txt"
    tar czf "$OUT/ext.tgz" .torch_extensions
    el "ext built"
}
cuda_tests() {  # cuda_tests NAME TIMEOUT_S PYTEST_ARGS...: rc, summary and failures -> rows.txt
    local name=$1 to=$2 rc
    shift 2
    timeout -k 10 "$to" python3 -m pytest -q "$@" -p no:cacheprovider > "$R/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc: $(tail -1 "$R/$name.log")" >> "$OUT/rows.txt"
    grep -E "^(FAILED|ERROR|E  )" "$R/$name.log" | head -30 >> "$OUT/rows.txt"
    el "$name"
    return $rc
}
census() {  # census TIMEOUT_S PRECISION...: scripts/gpu/census.py per precision -> census.txt, rows.txt
    local to=$1 prec
    shift
    for prec in "$@"; do
        timeout -k 10 "$to" python3 scripts/gpu/census.py "$prec" > "$R/census_$prec.log" 2>&1
        { echo "== census $prec"; grep -A40 "^census" "$R/census_$prec.log" | head -50; } >> "$OUT/census.txt"
        grep "^census\|^timeline" "$R/census_$prec.log" | sed "s/^/$prec: /" >> "$OUT/rows.txt"
        el "census $prec"
    done
}
