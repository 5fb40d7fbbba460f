"""Issue 9's failure class on a generated capture, on a CPU: the default hash grid memorizes the
training views of a phone capture instead of forming geometry, while a smaller table reconstructs it.

The capture is :data:`nerf_lightning.data.synthetic.FRUIT_FAILURE`: the ``phone`` rig (the shared
``fruit`` capture's camera model and layout: portrait, ``fl_x != fl_y``, off-centre principal point,
its lens, 24-72 degree elevations, ``aabb_scale`` 32, cameras inside the box) over the ``fruit_bed``
scene (an apple and a banana on a near-white bed that fills the views), 40 views at 37x50, every 8th
held out. Training is ``bench.capture_ab``'s ``CPU_REPRO`` recipe (the fruit capture's CPU reproduction,
without its 1/16 downscale). Thresholds come from the measurements in ``BENCHMARKS.md`` (2026-11-30,
"a generated capture that fails like fruit"), with margins for other seeds and machines.

If the default grid starts to reconstruct this capture, the failure may be fixed: check the real
``fruit`` capture (``bench.capture_ab --cpu-repro``), then update this test and the README.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nerf_lightning.bench.capture_ab import CPU_REPRO, run_variant
from nerf_lightning.data.synthetic import FRUIT_FAILURE, generate_scene

pytestmark = pytest.mark.slow

STEPS = 400
SEED = 42
#: CPU_REPRO without its 1/16 downscale: the generated views already have the fruit capture's 1/16 size
RECIPE = [o for o in CPU_REPRO if not o.startswith("data.downscale")]
TABLE_15 = ["model.field.encoding.log2_hashmap_size=15"]
#: Thresholds hold for all three measured training seeds (42, 0, 1), so that a machine whose floating-
#: point sums differ (and whose chaotic first steps then diverge) still passes: the 2^15 table's held-out
#: PSNR stays above this (measured 24.6, 25.7, 21.9 dB) ...
SMALL_ABOVE = 21.0
#: ... the default grid's below this (measured 18.8, 22.6, 13.0 dB; a constant image scores 14.0 dB) ...
DEFAULT_BELOW = 23.0
#: ... and at least this far below the small table's (measured 5.8, 3.1, 8.8 dB) ...
MARGIN = 2.0
#: ... while its training PSNR beats its held-out PSNR by at least this much (measured 3.6, 1.5, 10.3 dB)
DEFAULT_GAP = 1.0


def test_default_hash_grid_memorizes_the_generated_fruit_capture(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    capture = generate_scene(tmp_path / "fruit_bed", **FRUIT_FAILURE).parent
    default = run_variant(str(capture), RECIPE, STEPS, SEED, tmp_path / "default")
    small = run_variant(str(capture), [*RECIPE, *TABLE_15], STEPS, SEED, tmp_path / "table_15")
    report = (
        f"default grid: held-out {default['heldout_psnr']:.2f} dB, training {default['train_psnr']:.2f} dB; "
        f"2^15 table: held-out {small['heldout_psnr']:.2f} dB, training {small['train_psnr']:.2f} dB; "
        f"constant image {default['constant_psnr']:.2f} dB over {default['views']} held-out views"
    )
    print(report)
    assert default["views"] == 5, report
    assert small["heldout_psnr"] > SMALL_ABOVE, f"the small grid no longer reconstructs the capture: {report}"
    assert default["heldout_psnr"] < DEFAULT_BELOW, (
        f"the default grid reconstructs the generated fruit capture (issue 9 fixed?): {report}"
    )
    assert default["heldout_psnr"] < small["heldout_psnr"] - MARGIN, report
    assert default["train_psnr"] - default["heldout_psnr"] > DEFAULT_GAP, f"no memorization: {report}"
