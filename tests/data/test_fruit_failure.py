"""Issue 9's failure class on a generated capture, on a CPU, and the two defaults that act on it.

The capture is :data:`nerf_lightning.data.synthetic.FRUIT_FAILURE`: the ``phone`` rig (the shared
``fruit`` capture's camera model and layout: portrait, ``fl_x != fl_y``, off-centre principal point,
its lens, 24-72 degree elevations, ``aabb_scale`` 32, cameras inside the box) over the ``fruit_bed``
scene (an apple and a banana on a near-white bed that fills the views), 40 views at 37x50, every 8th
held out. Training is ``bench.capture_ab``'s ``CPU_REPRO`` recipe (the fruit capture's CPU reproduction,
without its 1/16 downscale), seed 42, 400 steps, three variants:

- neither fix (``model.net.renderer.near_plane=0``, ``model.net.renderer.gradient_scaling_distance=null``: the
  defaults before issue 9): the model memorizes the training views (held-out PSNR far below the training
  PSNR), so the generated capture still reproduces the failure;
- the near plane alone (0.2 NGP units): it removes the failure (held-out PSNR several dB higher);
- near-camera gradient scaling alone (1.0 NGP unit, ``volume/gradient_scaling.py``): it stops the
  memorization (the gap between training and held-out PSNR shrinks) but fits this small capture more
  slowly, so at 400 steps its held-out PSNR is about the failing run's.

If one of these halves fails, that mechanism no longer reaches the renderer (``tests/render`` checks that
the defaults switch both on; with a mechanism cut off, its run would equal the failing run bit for bit).
The combination is not pinned here; on the real capture on a GPU it reconstructs every seed measured
(``docs/investigations/2026-11-30-fruit-failure.md``).

**Each run is pinned to one arithmetic.** This early training is chaotic: the last bit of a sum decides
which cells the occupancy grid keeps, and the runs part from there. Seed 42, held-out / training PSNR
(dB), measured 2026-12-01 unless said:

======================================  ============  ============  ==================
arithmetic                              neither       near plane    gradient scaling
======================================  ============  ============  ==================
earlier machine, 2 threads (11-30)      19.27 / 22.35 23.94 / 25.33 22.14 / 23.48
Intel Xeon AVX-512, 2 threads           19.01 / 23.26 23.39 / 25.19 19.90 / 20.69
AMD EPYC, avx2 kernels, 1 thread        18.82 / 22.27 24.15 / 25.26 (not run)
AMD EPYC, ``default`` kernels, 1 thread 22.02 / 24.47 23.18 / 25.00 21.37 / 23.27
the same, ``MKL_CBWR=COMPATIBLE``        21.86 / 24.33 23.09 / 24.92 20.75 / 21.54
**the pin below** (AMD EPYC)            20.09 / 23.40 23.84 / 25.71 19.73 / 21.27
======================================  ============  ============  ==================

Unpinned, the failing run's held-out PSNR spans 18.8-22.0 dB (with ``default`` kernels the capture does
not fail at all) and gradient scaling's 19.7-22.1 dB, so the verdict of one unpinned run is a draw. In
every row where the capture fails, the near plane gains 3.8-5.3 dB held out and gradient scaling shrinks
the memorization gap by 1.7-3.5 dB. Other seeds spread as widely
(``docs/investigations/2026-11-30-fruit-failure.md``: seed 0 does not fail,
seed 1 fails with every variant). So every variant runs in a fresh interpreter with
``ATEN_CPU_CAPABILITY=avx2`` (ATen's vector kernels of one instruction set, whatever the CPU offers beyond
it), ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical reproducibility: the same results on Intel and
AMD processors; it alone moved the failing run from 18.82 to 20.09 dB) and one thread (no reduction order
that depends on the thread count): the pinned numbers hold on every x86-64 machine with AVX2 and this
torch build, whatever the caller's ``ATEN_CPU_CAPABILITY`` or ``OMP_NUM_THREADS``. On a CPU without AVX2,
torch ignores the request and runs its scalar kernels, another arithmetic; the report names the kernels
each run used.

The thresholds leave 0.6-1.8 dB of room around the pinned values: the pin removes the spread across
machines, the room absorbs a change of torch or MKL version that moves a run by less than that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from runs import child_env

from benchmarks.capture_ab import CPU_REPRO
from nerf_lightning.data.synthetic import FRUIT_FAILURE, generate_scene

pytestmark = [pytest.mark.slow, pytest.mark.repro, pytest.mark.timeout(3600)]

STEPS = 400
SEED = 42
#: CPU_REPRO without its 1/16 downscale: the generated views already have the fruit capture's 1/16 size
RECIPE = [o for o in CPU_REPRO if not o.startswith("data.downscale")]
VARIANTS = {
    "neither": ["model.net.renderer.near_plane=0.0", "model.net.renderer.gradient_scaling_distance=null"],
    "near plane": ["model.net.renderer.near_plane=0.2", "model.net.renderer.gradient_scaling_distance=null"],
    "gradient scaling": [
        "model.net.renderer.near_plane=0.0",
        "model.net.renderer.gradient_scaling_distance=1.0",
    ],
}
#: without either fix the held-out PSNR stays below this (pinned: 20.09 dB) ...
FAILED_BELOW = 21.0
#: ... while the training views are fitted better than the held-out ones by at least this (3.31 dB)
MEMORIZATION_GAP = 1.5
#: with the near plane the held-out PSNR exceeds this (23.84 dB), and the failing run's by at least
#: NEAR_MARGIN (3.75 dB)
NEAR_ABOVE, NEAR_MARGIN = 22.5, 2.5
#: gradient scaling shrinks the failing run's memorization gap (training minus held-out PSNR) by at least
#: this (3.31 -> 1.54 dB), without losing more than SCALING_HELDOUT_ROOM of its held-out PSNR (0.36 dB)
SCALING_GAP_SHRINK, SCALING_HELDOUT_ROOM = 1.0, 1.0

#: one arithmetic on every x86-64 machine with AVX2 (see the module docstring)
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

_CHILD = """
import json, sys
import torch
torch.set_num_threads(1)
from benchmarks.capture_ab import run_variant
capture, out, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
result = run_variant(capture, sys.argv[5:], steps, seed, __import__("pathlib").Path(out))
result["capability"] = torch.backends.cpu.get_cpu_capability()
print("RESULT " + json.dumps(result), flush=True)
"""


def run_pinned(capture: str, overrides: list[str], out_dir: Path) -> dict:
    """One variant in a fresh interpreter under :data:`PINNED` (the capability is read at import)."""
    argv = [sys.executable, "-c", _CHILD, capture, str(out_dir), str(STEPS), str(SEED), *overrides]
    proc = subprocess.run(argv, env=child_env(**PINNED), capture_output=True, text=True, timeout=3000)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"the run {overrides} failed:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def _report(name: str, r: dict[str, float]) -> str:
    return f"{name}: held-out {r['heldout_psnr']:.2f} dB, training {r['train_psnr']:.2f} dB"


def test_near_plane_removes_the_fruit_failure_gradient_scaling_its_memorization(tmp_path: Path) -> None:
    capture = str(generate_scene(tmp_path / "fruit_bed", **FRUIT_FAILURE).parent)
    workers = max(1, min(len(VARIANTS), (os.cpu_count() or 1)))  # one thread each
    with ThreadPoolExecutor(workers) as pool:
        futures = {
            name: pool.submit(run_pinned, capture, [*RECIPE, *overrides], tmp_path / name.replace(" ", "_"))
            for name, overrides in VARIANTS.items()
        }
        runs = {name: future.result() for name, future in futures.items()}
    failing, near, scaled = runs["neither"], runs["near plane"], runs["gradient scaling"]
    report = (
        "; ".join(_report(name, r) for name, r in runs.items())
        + f"; constant image {failing['constant_psnr']:.2f} dB over {failing['views']} held-out views"
        + f"; ATen kernels {failing['capability']}"
    )
    print(report)
    assert failing["views"] == near["views"] == scaled["views"] == 5, report
    assert failing["heldout_psnr"] < FAILED_BELOW, f"the capture no longer reproduces the failure: {report}"
    assert failing["train_psnr"] - failing["heldout_psnr"] > MEMORIZATION_GAP, f"no memorization: {report}"
    assert near["heldout_psnr"] > NEAR_ABOVE, f"the near plane no longer removes the failure: {report}"
    assert near["heldout_psnr"] > failing["heldout_psnr"] + NEAR_MARGIN, report
    gap, scaled_gap = (r["train_psnr"] - r["heldout_psnr"] for r in (failing, scaled))
    assert scaled_gap < gap - SCALING_GAP_SHRINK, (
        f"gradient scaling no longer stops the memorization: {report}"
    )
    assert scaled["heldout_psnr"] > failing["heldout_psnr"] - SCALING_HELDOUT_ROOM, report
