#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists ($LEGO, $OUT paths) are split into words on purpose
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 240 python3 -m nerf_lightning.ops._ext 2>&1 | tail -2; el build
tar czf $OUT/ext.tgz .torch_extensions
for a in "32-true" "32-true --eager" "bf16-mixed"; do timeout 60 python3 scripts/gpu/purestep.py $a 2>&1 | grep purestep; done; el pure
timeout 110 python3 -m nerf_lightning.bench.curve --checkpoints 12 --rate 90 --tolerance 1 --profile-steps 40 --out $OUT/new -- experiment=blender data.path=.devdata/lego logger=csv 2>&1 | grep -v Warning | tail -5; el new
python3 - <<'PY'
import json, os
p = json.load(open(os.environ["OUT"] + "/new/curve.json"))["points"][0]["profile"]
print({k: v for k, v in p.items() if not isinstance(v, (dict, list))}, p["syncs_per_step"])
for t, c, n in p["top_host_ops_ms_per_step"]: print(f"  host {t:.3f} ms x{c} {n}")
for t, n in p["top_kernels_ms_per_step"]: print(f"  gpu {t:.3f} {n}")
PY
