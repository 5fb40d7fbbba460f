"""`python -m nerf_lightning.bench.curve` on the CPU: one run per checkpoint, JSON and plot written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nerf_lightning.bench.curve import main
from nerf_lightning.data.synthetic import generate_scene


@pytest.mark.slow
def test_curve_runs_each_checkpoint_and_writes_json_and_plot(tmp_path: Path) -> None:
    torch.set_num_threads(2)
    scene = tmp_path / "scene"
    generate_scene(scene, n_views=8, width=24, height=24, supersample=1)
    out = tmp_path / "curve"
    overrides = [
        "experiment=cpu", "logger=none", f"data.path={scene}", "data.batch_size=256",
        "model.grid_resolution=16", "model.field.encoding.n_levels=4",
        "model.field.encoding.max_resolution=64",
        "model.step_size=0.03", "model.max_samples_per_ray=32", "model.grid_warmup_steps=4",
        "callbacks.progress_bar=null",
    ]  # fmt: skip
    # an earlier curve to compare with
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"label": "old", "points": [{"train_s": 1.0, "psnr": 10.0}]}))
    args = ["--checkpoints", "1,2", "--rate", "20", "--tolerance", "100", "--out", str(out)]
    args += ["--compare", str(old)]
    assert main([*args, "--", *overrides]) == 0
    result = json.loads((out / "curve.json").read_text())
    points = result["points"]
    assert [p["checkpoint_s"] for p in points] == [1.0, 2.0]
    # each run's schedule is sized to its checkpoint: the first from --rate, the next from the rate the
    # first one measured (at least 5 steps)
    assert points[0]["steps"] == 20
    assert points[1]["steps"] == max(5, round(points[0]["steps"] / points[0]["train_s"] * 2.0))
    for p in points:
        assert p["psnr"] > 5.0 and p["rays_per_s"] > 0 and p["train_s"] > 0
    assert result["overrides"] == overrides and result["device"]
    png = out / "curve.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
