"""bench.viewer's report: the printed table and the runner's rows (the numbers come from the GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("viser")


from benchmarks import readers
from benchmarks.experiments import EXPERIMENTS
from benchmarks.viewer import compare_windows, print_report

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
               "frames_received": 900, "frames_per_s": 14.0, "frames_completed": 3,
               "viewer/render_s": 4.2, "viewer/refill_s": 0.5, "viewer/bursts": 580.0},
        "window": {"from_step": 1050, "to_step": 20000, "windows": 380, "off_steps_per_s": 330.0,
                   "on_steps_per_s": 306.9, "ratio": 0.93, "lost": 0.07},
    },
}  # fmt: skip


def test_report_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(REPORT, "RUN")
    out = capsys.readouterr().out
    assert "canvas  800px: frame   800x800   12.50 frames/s end to end  (render 61.0 ms/frame)" in out
    assert "viewer=off 330.0 steps/s, viewer=on with a client 310.2 steps/s (+6.0 % lost;" in out
    row = out.splitlines()[-1]
    assert row.startswith(
        "| 1,050-20,000 (380 windows) | 330.0 steps/s | 306.9 steps/s (800x800) | **0.930** |"
    )
    assert "**7.0 %** | <= 10 % (met) | 6.5 % bursts + 0.8 % refills, 9.0 bursts/s | 900 sent" in row


def test_windows_compare_the_same_steps_after_the_client_connected() -> None:
    """The two runs over the windows both logged after the client's first step: 1000 / mean ms."""
    off = {50: 9.0, 100: 3.0, 150: 3.0, 200: 3.0, 250: 3.0}
    on = {50: 20.0, 100: 20.0, 150: 3.2, 200: 3.4, 250: 3.3, 300: 3.3}  # 300: only in this run
    w = compare_windows(off, on, after_step=120)
    assert (w["from_step"], w["to_step"], w["windows"]) == (150, 250, 3)
    assert w["off_steps_per_s"] == pytest.approx(1e3 / 3.0)
    assert w["on_steps_per_s"] == pytest.approx(1e3 / 3.3)
    assert w["lost"] == pytest.approx(1 - 3.0 / 3.3)
    with pytest.raises(RuntimeError, match="only 1 throughput windows after step 200"):
        compare_windows(off, on, after_step=200)


def test_runner_rows(tmp_path: Path) -> None:
    (tmp_path / "viewer_bench.json").write_text(json.dumps(REPORT))
    rows = readers.viewer_json(tmp_path, tmp_path / "log")
    assert [r["part"] for r in rows] == ["@viewer_off", "@viewer_on", "@fps_800", "@fps_256"]
    assert rows[1]["ratio"] == pytest.approx(0.93) and rows[2]["frames_per_s"] == 12.5
    assert "steps 1050-20000: 330.0 -> 306.9 steps/s, 7.0 % lost" in rows[1]["note"]
    job = EXPERIMENTS["viewer"].jobs[0]
    assert job.read is readers.viewer_json and "benchmarks.viewer" in job.argv
