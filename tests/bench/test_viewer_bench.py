"""bench.viewer's report: the printed table and the runner's rows (the numbers come from the GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nerf_lightning.bench import readers
from nerf_lightning.bench.experiments import EXPERIMENTS
from nerf_lightning.bench.viewer import print_report

REPORT = {
    "date": "2026-12-01",
    "device": "NVIDIA H200",
    "sizes": [800, 256],
    "fps": [
        {"canvas": 800, "frame": "800x800", "frames": 30, "fps": 12.5, "render_ms": 61.0},
        {"canvas": 256, "frame": "256x256", "frames": 30, "fps": 60.0, "render_ms": 9.5},
    ],
    "train": {
        "off": {"steps": 20000, "steps_per_s": 330.0, "val/psnr": 35.1, "time/train_s": 60.6},
        "on": {"steps": 20000, "steps_per_s": 310.2, "val/psnr": 35.0, "time/train_s": 64.5,
               "frames_received": 900, "frames_per_s": 14.0},
    },
}  # fmt: skip


def test_report_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(REPORT, "RUN")
    out = capsys.readouterr().out
    assert "canvas  800px: frame   800x800   12.50 frames/s end to end  (render 61.0 ms/frame)" in out
    assert "viewer=off 330.0 steps/s, viewer=on with a client 310.2 steps/s (+6.0 % lost;" in out


def test_runner_rows(tmp_path: Path) -> None:
    (tmp_path / "viewer_bench.json").write_text(json.dumps(REPORT))
    rows = readers.viewer_json(tmp_path, tmp_path / "log")
    assert [r["part"] for r in rows] == ["@viewer_off", "@viewer_on", "@fps_800", "@fps_256"]
    assert rows[1]["ratio"] == pytest.approx(310.2 / 330.0) and rows[2]["frames_per_s"] == 12.5
    job = EXPERIMENTS["viewer"].jobs[0]
    assert job.read is readers.viewer_json and "nerf_lightning.bench.viewer" in job.argv
