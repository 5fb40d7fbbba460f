"""What the CPU tries of the GPU scripts (``benchmarks/*_gpu.sh``) share: a tiny training, the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runs import child_env

REPO = Path(__file__).resolve().parents[2]

#: the CPU preset at its smallest (a 24x24 scene: seconds a run); the held-out fit 2 steps a view
TINY = (
    "accelerator=cpu experiment=cpu data.batch_size=128 data.steps_per_epoch=8 "
    "model.net.renderer.occupancy.resolution=16 model.net.renderer.occupancy.warmup_steps=4 "
    "model.net.renderer.occupancy.update_every=4 model.net.field.encoding.n_levels=4 "
    "model.net.field.encoding.log2_hashmap_size=12 model.net.field.encoding.max_resolution=64 "
    "model.net.renderer.max_samples_per_ray=32 model.net.renderer.step_size=0.054 "
    "model.save_val_images=false model.heldout_fit.steps=2 trainer.log_every_n_steps=2"
)


def run_script(script: str, *args: str | Path, work: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``bash benchmarks/<script> ARGS`` from the repository root as on the GPU machine, less what this one
    lacks: no wheels (``WHEELS=``), no extension step (``SKIP_EXT=1``), this interpreter."""
    environ = child_env(PYTHON=sys.executable, SKIP_EXT="1", WHEELS="", WORK=str(work), **env)
    return subprocess.run(["bash", f"benchmarks/{script}", *map(str, args)], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
