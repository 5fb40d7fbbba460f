#!/usr/bin/env bash
# data.storage=host against device on one GPU, in one call: lego (.devdata/lego_official) and a generated
# capture of at least 20 GB of training pixels; steps/s and held-out PSNR at 60 s of training each
# (nerf_lightning.bench.curve --checkpoints 60). Steps in order of importance, each under its own
# `timeout`; a step that would not fit the call's remaining budget is skipped (and says so in
# summary.json). Writes into $OUT (one level, at most 6 files): generate.json, one <run>.json per run
# (bench.curve's curve.json) and summary.json.
#
#   OUT=/some/dir bash benchmarks/big_captures_gpu.sh
#
# Sizes by environment (defaults: the GPU run; the CPU check of this script uses tiny ones):
#   LEGO=.devdata/lego_official  LARGE_GB=20  LARGE_VIEWS=160  LARGE_W=2000  LARGE_H=1500
#   SECONDS_AT=60  BUDGET_S=530  RATE_DEVICE=330  RATE_HOST=250  LARGE_ROOT=outputs/large
#   LEGO_ARGS="experiment=blender data.path=$LEGO data.val_split=test data.max_test_views=50"
#   EXTRA="..." (train overrides for every run, e.g. experiment=cpu on a CPU)
# lego's PSNR is the mean over 50 of its 200 test views (evenly spaced): the evaluation of all 200
# would not fit the call; the generated capture's over 8 held-out views.
set -u
OUT=${OUT:?set OUT}
LEGO=${LEGO:-.devdata/lego_official}
LARGE_GB=${LARGE_GB:-20}
LARGE_VIEWS=${LARGE_VIEWS:-160}
LARGE_W=${LARGE_W:-2000}
LARGE_H=${LARGE_H:-1500}
SECONDS_AT=${SECONDS_AT:-60}
BUDGET_S=${BUDGET_S:-530}
RATE_DEVICE=${RATE_DEVICE:-330}
RATE_HOST=${RATE_HOST:-250}
LARGE_ROOT=${LARGE_ROOT:-outputs/large}
EXTRA=${EXTRA:-}
PY=${PY:-python}
SCRATCH=$(mktemp -d)
mkdir -p "$OUT"
STATUS="$SCRATCH/status.tsv"
: >"$STATUS"

# step NAME LIMIT_S COMMAND...: run under `timeout LIMIT_S` unless the budget has no LIMIT_S left
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - SECONDS))
  if ((left < limit)); then
    echo "== $name skipped: ${left}s left of the budget, it needs up to ${limit}s"
    printf '%s\tskipped\t0\n' "$name" >>"$STATUS"
    return 1
  fi
  echo "== $name (timeout ${limit}s, ${left}s left)"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$STATUS"
  return $rc
}

# curve NAME RATE LIMIT_S OVERRIDES...: one bench.curve run of SECONDS_AT s; its curve.json -> $OUT/NAME.json
curve() {
  local name=$1 rate=$2 limit=$3
  shift 3
  # --tolerance 1: one run per configuration (a miss of the 60 s is reported as the run's train_s)
  step "$name" "$limit" "$PY" -m nerf_lightning.bench.curve --checkpoints "$SECONDS_AT" --rate "$rate" \
    --tolerance 1 --label "$name" --out "$SCRATCH/$name" -- logger=none $EXTRA "$@" &&
    cp "$SCRATCH/$name/curve.json" "$OUT/$name.json"
}

nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null || true
LEGO_ARGS=${LEGO_ARGS:-experiment=blender data.path=$LEGO data.val_split=test data.max_test_views=50}
# shellcheck disable=SC2086 # LEGO_ARGS and EXTRA are lists of overrides
curve lego_device "$RATE_DEVICE" 110 $LEGO_ARGS data.storage=device
# shellcheck disable=SC2086
curve lego_host "$RATE_HOST" 110 $LEGO_ARGS data.storage=host

step generate 120 "$PY" -m benchmarks.big_captures generate --gb "$LARGE_GB" --views "$LARGE_VIEWS" \
  --width "$LARGE_W" --height "$LARGE_H" --root "$LARGE_ROOT" --json "$OUT/generate.json"
LARGE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$OUT/generate.json" 2>/dev/null)
df -h "$LARGE_ROOT" 2>/dev/null | tail -1
if [ -n "$LARGE" ]; then
  LARGE_ARGS=("data.path=$LARGE" data.max_val_views=8 data.max_test_views=8)
  curve large_device "$RATE_DEVICE" 150 "${LARGE_ARGS[@]}" data.storage=device
  curve large_host "$RATE_HOST" 150 "${LARGE_ARGS[@]}" data.storage=host
fi

"$PY" - "$OUT" "$STATUS" "$BUDGET_S" <<'EOF'
import json, sys
from pathlib import Path

out, status, budget = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
summary = {"budget_s": budget, "steps": {}, "runs": {}}
for line in status.read_text().splitlines():
    name, rc, secs = line.split("\t")
    summary["steps"][name] = {"exit": rc, "wall_s": int(secs)}
for f in sorted(out.glob("*.json")):
    if f.name in ("summary.json", "generate.json"):
        continue
    point = json.loads(f.read_text())["points"][0]
    keys = ("checkpoint_s", "train_s", "steps", "steps_per_s", "psnr", "psnr_ngp", "mem_peak_gb")
    summary["runs"][f.stem] = {k: point.get(k) for k in keys}
for scene in ("lego", "large"):
    d, h = summary["runs"].get(f"{scene}_device"), summary["runs"].get(f"{scene}_host")
    if d and h:
        summary[f"{scene}_host_over_device_steps_per_s"] = h["steps_per_s"] / d["steps_per_s"]
        summary[f"{scene}_host_minus_device_psnr"] = (h["psnr"] or 0) - (d["psnr"] or 0)
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
EOF
rm -rf "$SCRATCH"
