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
        "model.net.renderer.occupancy.resolution=16", "model.net.field.encoding.n_levels=4",
        "model.net.field.encoding.max_resolution=64",
        "model.net.renderer.step_size=0.03", "model.net.renderer.max_samples_per_ray=32",
        "model.net.renderer.occupancy.warmup_steps=4",
        "callbacks.progress_bar=null", "trainer.log_every_n_steps=2",
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
        assert p["psnr_ngp"] > 5.0 and p["per_view"]["image"] == ["0000.png"]
        # the timeline: the monitor's 2-step windows merged into bins of max_steps // 30 steps (at least
        # 1), in step order, together no more steps than the run made, at rates within the run's range
        bins = p["timeline"]
        assert bins and [b["end_step"] for b in bins] == sorted({b["end_step"] for b in bins})
        assert all(b["steps"] >= max(1, p["steps"] // 30) for b in bins[:-1])
        assert 0 < sum(b["steps"] for b in bins) <= p["steps"] and bins[-1]["end_step"] <= p["steps"]
        assert p["bin_steps_per_s_min"] == min(b["steps_per_s"] for b in bins) > 0
        binned_s = sum(b["steps"] / b["steps_per_s"] for b in bins)
        assert 0.5 < sum(b["steps"] for b in bins) / binned_s / p["steps_per_s"] < 2.0
    assert result["overrides"] == overrides and result["device"]
    png = out / "curve.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rate_timeline_merges_the_monitor_windows_into_bins() -> None:
    """Windows of 10 steps at 100 steps/s (90 % busy), then at 50 steps/s (45 %), in bins of 20 steps."""
    from types import SimpleNamespace

    from nerf_lightning.bench.curve import _RateTimeline
    from nerf_lightning.callbacks.throughput import ThroughputMonitor

    mon = ThroughputMonitor()
    timeline = _RateTimeline(n_bins=5)
    trainer = SimpleNamespace(callbacks=[mon], max_steps=100)
    timeline.on_train_start(trainer, None)
    windows = [(10, 0.1, 90.0)] * 4 + [(10, 0.2, 45.0)] * 4 + [(5, 0.05, -1.0)]
    step = 0
    for steps, seconds, util in windows:
        step += steps
        mon.latest_step = step
        mon.latest_local = {"steps": float(steps), "seconds": seconds, "gpu_util": util}
        timeline.on_train_batch_end(trainer, None)
        timeline.on_train_batch_end(trainer, None)  # the same window again: counted once
    timeline.on_train_end(trainer, None)
    got = [
        (b["end_step"], b["steps"], round(b["steps_per_s"], 6), b["gpu_utilization"]) for b in timeline.bins
    ]
    assert got == [(20, 20, 100.0, 90.0), (40, 20, 100.0, 90.0), (60, 20, 50.0, 45.0), (80, 20, 50.0, 45.0),
                   (85, 5, 100.0, None)]  # fmt: skip
