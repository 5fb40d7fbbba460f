"""Issue 9's failure class on a generated capture, on a CPU, and the two defaults that remove it.

The capture is :data:`nerf_lightning.data.synthetic.FRUIT_FAILURE`: the ``phone`` rig (the shared
``fruit`` capture's camera model and layout: portrait, ``fl_x != fl_y``, off-centre principal point,
its lens, 24-72 degree elevations, ``aabb_scale`` 32, cameras inside the box) over the ``fruit_bed``
scene (an apple and a banana on a near-white bed that fills the views), 40 views at 37x50, every 8th
held out. Training is ``bench.capture_ab``'s ``CPU_REPRO`` recipe (the fruit capture's CPU reproduction,
without its 1/16 downscale), seed 42, 400 steps.

Three runs (``docs/fruit.md``, "a generated capture that fails like fruit"):

- neither fix (``model.renderer.near_plane=0``, ``model.renderer.gradient_scaling_distance=null``: the
  defaults before issue 9): the model memorizes the training views (held-out 19.27 dB, training
  22.35 dB; a constant image scores 13.97 dB), so the generated capture still reproduces the failure;
- the near plane alone (0.2 NGP units): held-out 23.9 dB, training 25.3 dB;
- near-camera gradient scaling alone (1.0 NGP unit, ``render/gradient_scaling.py``): held-out 22.14 dB,
  training 23.48 dB.

Each of the two mechanisms that the default config combines removes the failure here; if one of these
halves fails, that mechanism no longer reaches the renderer (``tests/render`` checks that the defaults
switch both on). The combination itself is not pinned: at this seed and step count it fits this
capture more slowly (19.81 dB held-out, 20.06 dB training: no memorization gap), and on the real
capture on a GPU it reconstructs all 7 seeds measured.

The outcome of this chaotic early training depends on the seed (at seeds 1 and 2 every variant
measured fails, 12-13 dB), so the test pins seed 42 and 2 threads; the runs are deterministic there
(repeated to the hundredth), and the thresholds leave about 1 dB of room around the measured values.
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
NEITHER = ["model.renderer.near_plane=0.0", "model.renderer.gradient_scaling_distance=null"]
NEAR_PLANE_ONLY = ["model.renderer.near_plane=0.2", "model.renderer.gradient_scaling_distance=null"]
SCALING_ONLY = ["model.renderer.near_plane=0.0", "model.renderer.gradient_scaling_distance=1.0"]
#: without either fix the held-out PSNR stays below this (measured 19.27 dB) ...
FAILED_BELOW = 21.0
#: ... while the training views are fitted better than the held-out ones by at least this (3.1 dB)
MEMORIZATION_GAP = 1.5
#: with the near plane the held-out PSNR exceeds this (measured 23.9 dB), and the failing run's by
#: at least NEAR_MARGIN (4.6 dB)
NEAR_ABOVE, NEAR_MARGIN = 22.5, 2.5
#: with gradient scaling the held-out PSNR exceeds this (measured 22.14 dB), and the failing run's by
#: at least SCALING_MARGIN (2.87 dB)
SCALING_ABOVE, SCALING_MARGIN = 21.0, 2.0


def _report(name: str, r: dict[str, float]) -> str:
    return f"{name}: held-out {r['heldout_psnr']:.2f} dB, training {r['train_psnr']:.2f} dB"


def test_near_plane_and_gradient_scaling_each_remove_the_generated_fruit_failure(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    capture = str(generate_scene(tmp_path / "fruit_bed", **FRUIT_FAILURE).parent)
    failing = run_variant(capture, [*RECIPE, *NEITHER], STEPS, SEED, tmp_path / "neither")
    near = run_variant(capture, [*RECIPE, *NEAR_PLANE_ONLY], STEPS, SEED, tmp_path / "near")
    scaled = run_variant(capture, [*RECIPE, *SCALING_ONLY], STEPS, SEED, tmp_path / "scaled")
    report = (
        "; ".join(
            [_report("neither", failing), _report("near plane", near), _report("gradient scaling", scaled)]
        )
        + f"; constant image {failing['constant_psnr']:.2f} dB over {failing['views']} held-out views"
    )
    print(report)
    assert failing["views"] == near["views"] == scaled["views"] == 5, report
    assert failing["heldout_psnr"] < FAILED_BELOW, f"the capture no longer reproduces the failure: {report}"
    assert failing["train_psnr"] - failing["heldout_psnr"] > MEMORIZATION_GAP, f"no memorization: {report}"
    assert near["heldout_psnr"] > NEAR_ABOVE, f"the near plane no longer removes the failure: {report}"
    assert near["heldout_psnr"] > failing["heldout_psnr"] + NEAR_MARGIN, report
    assert scaled["heldout_psnr"] > SCALING_ABOVE, f"gradient scaling no longer removes the failure: {report}"
    assert scaled["heldout_psnr"] > failing["heldout_psnr"] + SCALING_MARGIN, report
