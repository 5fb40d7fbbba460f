"""``benchmarks.capture_ab`` builds its model as the train app does, so a batch rule in rays trains there
too (one process imitating two ranks, ``benchmarks/batch_rules.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.batch_rules import overrides as imitate
from benchmarks.capture_ab import run_variant
from nerf_lightning.data.synthetic import generate_scene

_ENC = "model.net.field.encoding"
TINY = [
    "accelerator=cpu", "experiment=cpu", "data.batch_size=64", "model.net.renderer.occupancy.resolution=16",
    f"{_ENC}.n_levels=4", f"{_ENC}.log2_hashmap_size=10", f"{_ENC}.max_resolution=32",
    "model.net.renderer.max_samples_per_ray=16", "model.net.renderer.step_size=0.1",
    "model.save_val_images=false",
]  # fmt: skip


@pytest.mark.parametrize(("rule", "optimizer_steps"), [("per_device", 8), ("large_batch", 4)])
def test_a_rule_in_rays_runs_half_the_optimizer_steps_at_twice_the_batch(
    tmp_path: Path, rule: str, optimizer_steps: int
) -> None:
    scene = generate_scene(tmp_path / "scene", n_views=6, width=16, height=16, supersample=1).parent
    overrides = [*TINY, *imitate(rule, 2)]
    result = run_variant(str(scene), overrides, steps=8, seed=0, out_dir=tmp_path / "run")
    assert result["optimizer_steps"] == optimizer_steps  # 8 reference steps of 2 batches: 4 under rays
