"""Issue 9's failure class on a generated capture, on a CPU, and the near plane that removes it.

The capture is :data:`nerf_lightning.data.synthetic.FRUIT_FAILURE`: the ``phone`` rig (the shared
``fruit`` capture's camera model and layout: portrait, ``fl_x != fl_y``, off-centre principal point,
its lens, 24-72 degree elevations, ``aabb_scale`` 32, cameras inside the box) over the ``fruit_bed``
scene (an apple and a banana on a near-white bed that fills the views), 40 views at 37x50, every 8th
held out. Training is ``bench.capture_ab``'s ``CPU_REPRO`` recipe (the fruit capture's CPU reproduction,
without its 1/16 downscale), seed 42.

Two runs (``BENCHMARKS.md``, 2026-11-30, "a generated capture that fails like fruit"):

- ``model.near_plane=0`` (the default before issue 9's fix): the model memorizes the training views
  (held-out 18.8-19.3 dB, training 22.4 dB; a constant image scores 14.0 dB), so the generated
  capture still reproduces the failure;
- the default config (``model.near_plane`` 0.2): it reconstructs them (held-out 23.9 dB, training
  25.3 dB). If this half fails, the fix has regressed (the near plane no longer reaches the marcher, or
  the default changed).

The outcome of this chaotic early training depends on the seed: at seed 0 both runs reconstruct
(22.6 and 23.8 dB) and at seed 1 both fail (13.0 and 13.1 dB), so the test pins seed 42 and 2 threads;
its thresholds leave 1.5-2 dB of room around the measured values.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nerf_lightning.bench.capture_ab import CPU_REPRO, run_variant
from nerf_lightning.data.synthetic import FRUIT_FAILURE, generate_scene

pytestmark = [pytest.mark.slow, pytest.mark.repro]

STEPS = 400
SEED = 42
#: CPU_REPRO without its 1/16 downscale: the generated views already have the fruit capture's 1/16 size
RECIPE = [o for o in CPU_REPRO if not o.startswith("data.downscale")]
#: without the near plane the held-out PSNR stays below this (measured 18.8 and 19.3 dB) ...
FAILED_BELOW = 21.0
#: ... while the training views are fitted better than the held-out ones by at least this (3.1-3.6 dB)
MEMORIZATION_GAP = 1.5
#: with the default near plane the held-out PSNR exceeds this (measured 23.9 dB) ...
FIXED_ABOVE = 22.5
#: ... and beats the run without it by at least this much (measured 4.7 dB)
MARGIN = 2.5


def test_near_plane_removes_the_generated_fruit_failure(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    capture = generate_scene(tmp_path / "fruit_bed", **FRUIT_FAILURE).parent
    failing = run_variant(str(capture), [*RECIPE, "model.near_plane=0.0"], STEPS, SEED, tmp_path / "near_0")
    fixed = run_variant(str(capture), RECIPE, STEPS, SEED, tmp_path / "default")
    report = (
        f"near plane 0: held-out {failing['heldout_psnr']:.2f} dB, training {failing['train_psnr']:.2f} dB; "
        f"default: held-out {fixed['heldout_psnr']:.2f} dB, training {fixed['train_psnr']:.2f} dB; "
        f"constant image {failing['constant_psnr']:.2f} dB over {failing['views']} held-out views"
    )
    print(report)
    assert failing["views"] == fixed["views"] == 5, report
    assert failing["heldout_psnr"] < FAILED_BELOW, f"the capture no longer reproduces the failure: {report}"
    assert failing["train_psnr"] - failing["heldout_psnr"] > MEMORIZATION_GAP, f"no memorization: {report}"
    assert fixed["heldout_psnr"] > FIXED_ABOVE, f"the default config fails like fruit again: {report}"
    assert fixed["heldout_psnr"] > failing["heldout_psnr"] + MARGIN, report
