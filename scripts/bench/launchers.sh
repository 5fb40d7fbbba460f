#!/usr/bin/env bash
# The same DDP training on one node, launched by torchrun and by Lightning's own launcher: training
# throughput (metrics.json train/rays_per_s, summed over ranks, validation excluded) must agree within 5 %.
# Runs alternate (Lightning, torchrun, Lightning, ...) so that drifts hit both; medians are compared.
#
#   bash scripts/bench/launchers.sh DATA_PATH [STEPS] [REPEATS]      # GPUS=2 by default
#   EXTRA="experiment=cpu accelerator=cpu" GPUS=2 bash scripts/bench/launchers.sh DATA 30 1   # CPU smoke run
#
# Results: $OUT/launchers.json and one run directory per launch under $OUT. Exit 1 when they differ by
# more than TOLERANCE (0.05).
set -euo pipefail

DATA=${1:?"usage: launchers.sh DATA_PATH [STEPS] [REPEATS]"}
STEPS=${2:-3000}
REPEATS=${3:-2}
GPUS=${GPUS:-2}
OUT=${OUT:-/tmp/launchers}
PY=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
TOLERANCE=${TOLERANCE:-0.05}
mkdir -p "$OUT"

read -r -a extra <<< "${EXTRA:-}"
# overwrite=true: a second invocation with the same $OUT measures fresh runs in the same folders
common=(strategy=ddp "devices=$GPUS" "data.path=$DATA" "trainer.max_steps=$STEPS" logger=csv overwrite=true
        callbacks.progress_bar=null model.save_val_images=false ${extra[@]+"${extra[@]}"})

# build or check the CUDA extension once, outside the timings
"$PY" -m nerf_lightning.ops._ext >/dev/null 2>&1 || echo "[launchers] no CUDA extension: reference ops"

for r in $(seq 1 "$REPEATS"); do
    echo "[launchers] repeat $r/$REPEATS: Lightning's launcher"
    timeout "$RUN_TIMEOUT" "$PY" -m nerf_lightning.train "${common[@]}" "hydra.run.dir=$OUT/lightning_$r" \
        > "$OUT/lightning_$r.log" 2>&1
    echo "[launchers] repeat $r/$REPEATS: torchrun"
    timeout "$RUN_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc-per-node="$GPUS" \
        -m nerf_lightning.train "${common[@]}" "hydra.run.dir=$OUT/torchrun_$r" > "$OUT/torchrun_$r.log" 2>&1
done

"$PY" - "$OUT" "$REPEATS" "$TOLERANCE" <<'PYEOF'
import json, statistics, sys
from pathlib import Path

out, repeats, tol = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
runs = {}
for launcher in ("lightning", "torchrun"):
    runs[launcher] = []
    for r in range(1, repeats + 1):
        m = json.loads((out / f"{launcher}_{r}" / "metrics.json").read_text())
        runs[launcher].append({k: m.get(k) for k in ("train/rays_per_s", "train/samples_per_s", "val/psnr",
                                                     "steps", "time/train_s")})
med = {k: statistics.median(x["train/rays_per_s"] for x in v) for k, v in runs.items()}
rel = med["torchrun"] / med["lightning"] - 1.0
result = {"runs": runs, "median_rays_per_s": med, "torchrun_vs_lightning": rel, "tolerance": tol,
          "pass": abs(rel) <= tol}
(out / "launchers.json").write_text(json.dumps(result, indent=2) + "\n")
for k, v in runs.items():
    print(f"{k:9s} rays/s " + "  ".join(f"{x['train/rays_per_s']:.4g}" for x in v)
          + f"   median {med[k]:.4g}   val/psnr " + "  ".join(f"{x['val/psnr']:.2f}" for x in v))
print(f"torchrun vs Lightning: {100 * rel:+.2f} % (tolerance {100 * tol:.0f} %): "
      + ("PASS" if result["pass"] else "FAIL"))
sys.exit(0 if result["pass"] else 1)
PYEOF
