"""Empty space in renders: random training backgrounds charge the faint density a fixed background would
leave there, with or without ``model.net.loss.alpha_weight`` (the opacity loss against the training images'
alpha;
the budgeted step's term is in ``tests/volume/test_fixed_budget.py``, its CUDA graph in
``tests/models/test_view_corrections_cuda.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.capture_ab import run_variant
from nerf_lightning.data.synthetic import generate_scene

_ENC = "model.net.field.encoding"
#: the render recipe (pixel centres, random backgrounds), a small model
SMALL = [
    "accelerator=cpu", "experiment=cpu", "data.batch_size=256", "model.net.renderer.occupancy.resolution=16",
    f"{_ENC}.n_levels=4", f"{_ENC}.log2_hashmap_size=12", f"{_ENC}.max_resolution=64",
    "model.net.renderer.max_samples_per_ray=32", "model.net.renderer.step_size=0.05",
    "model.save_val_images=false",
    "data.pixel_jitter=false",
]  # fmt: skip


#: two trainings of the same renders, with and without the loss (about a minute on 2 cores): make test-repro
pytestmark = pytest.mark.repro


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RGBA renders over a transparent background (the generated scene), 32x32."""
    out = tmp_path_factory.mktemp("opacity") / "scene"
    return generate_scene(out, n_views=16, width=32, height=32, supersample=1).parent


def test_random_backgrounds_leave_no_density_in_empty_space(renders: Path, tmp_path: Path) -> None:
    """Held out over black in linear RGB (instant-ngp's run.py metric, which reads an opacity of 0.01 as
    0.10) stays within 1.5 dB of held out over white, with the opacity loss off (the default) and at 1
    (measured: 20.57 / 19.65 and 20.76 / 19.68 dB at 600 steps, seed 0). Trained over white without the
    loss (the render recipe until 2026-12-07) the two were 6 dB apart here (20.2 against 14.0 dB)."""
    for name, weight in (("default", "0"), ("charged", "1")):
        m = run_variant(str(renders), [*SMALL, f"model.net.loss.alpha_weight={weight}"], steps=600, seed=0,
                        out_dir=tmp_path / name)  # fmt: skip
        print(f"{name}: over white {m['heldout_psnr']:.2f} dB, over black {m['heldout_psnr_ngp']:.2f} dB")
        assert abs(m["heldout_psnr"] - m["heldout_psnr_ngp"]) < 1.5, (name, m)
        assert m["heldout_psnr"] > 18.0, (name, m)
