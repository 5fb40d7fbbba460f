"""``benchmarks/official_gpu.sh`` (lego on its published protocol) on the CPU: its usage line, and its table
reader on run folders whose numbers are known. The script itself ran its three modes on one H100 on
2026-12-07 (docs/benchmarks/2026-12-07.md) after a CPU try with tiny settings (``TRAIN_ARGS``); a run of
it takes minutes, too long for the suite."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import official_table

SCRIPT = Path(official_table.__file__).with_name("official_gpu.sh")


def test_the_script_names_its_modes_and_refuses_others() -> None:
    out = subprocess.run(["bash", str(SCRIPT), "sweep", "/tmp/x"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == "usage: bash benchmarks/official_gpu.sh screen|curve|seeds OUT"
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=30).returncode == 0


def _write(path: Path, data: dict) -> None:
    path.mkdir(parents=True)
    (path / ("curve.json" if "points" in data else "metrics.json")).write_text(json.dumps(data))


def test_the_table_reads_fixed_step_runs_curves_and_training_view_evals(tmp_path: Path) -> None:
    # a fixed-step run that validated on training views (val/*) and scored the test split (test/*)
    _write(tmp_path / "alpha_1", {
        "steps": 20400, "time/train_s": 60.0, "val/psnr": 38.5, "test/psnr": 36.1, "test/psnr_black": 36.4,
        "test/psnr_ngp": 35.2, "test/per_view": {"psnr": [36.0]},
    })  # fmt: skip
    _write(tmp_path / "curve_15_300", {"points": [
        {"checkpoint_s": 15, "steps": 5100, "train_s": 14.0, "steps_per_s": 364.3, "psnr": 34.9,
         "psnr_black": 35.0, "psnr_ngp": 34.4},
        {"checkpoint_s": 300, "steps": 109000, "train_s": 298.0, "steps_per_s": 365.8, "psnr": 36.3,
         "psnr_black": None, "psnr_ngp": float("nan")},
    ]})  # fmt: skip
    _write(tmp_path / "train_views_300", {"split": "train", "train/psnr": 39.25, "n_views": 10})
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed.log").write_text("Traceback ...")
    (tmp_path / "not_a_run").mkdir()

    rows = official_table.rows(tmp_path)
    assert [r["run"] for r in rows] == [
        "alpha_1", "crashed (no results)", "curve_15_300@15s", "curve_15_300@300s", "train_views_300",
    ]  # fmt: skip
    assert rows[0] == {
        "run": "alpha_1", "steps": 20400.0, "train_s": 60.0, "steps_per_s": 340.0, "psnr": 36.1,
        "psnr_black": 36.4, "psnr_ngp": 35.2, "psnr_train_views": 38.5,
    }  # fmt: skip
    assert rows[3]["psnr"] == 36.3 and rows[3]["psnr_black"] is None and rows[3]["psnr_ngp"] is None
    assert rows[4] == {"run": "train_views_300", "psnr_train_views": 39.25}

    lines = official_table.table(rows).splitlines()
    assert lines[0].split() == ["run", "steps", "train_s", "steps/s", "white", "black", "ngp", "train_views"]
    assert lines[1].split() == ["alpha_1", "20400", "60.0", "340.0", "36.100", "36.400", "35.200", "38.500"]
    assert lines[2].split()[:3] == ["crashed", "(no", "results)"]
    assert lines[4].split() == ["curve_15_300@300s", "109000", "298.0", "365.8", "36.300", "-", "-", "-"]


def test_a_run_validated_on_the_test_split_reads_its_val_keys(tmp_path: Path) -> None:
    _write(tmp_path / "timed", {"steps": 100, "time/train_s": 2.0, "val/psnr": 30.0, "val/psnr_black": 31.0})
    (row,) = official_table.rows(tmp_path)
    assert row["psnr"] == 30.0 and row["psnr_black"] == 31.0 and row["psnr_train_views"] is None
    assert row["steps_per_s"] == pytest.approx(50.0)
