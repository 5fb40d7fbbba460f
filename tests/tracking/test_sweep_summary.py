"""The multirun summary: the CSV and table of a sweep's jobs, and the Hydra callback that writes them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

from nerf_lightning.tracking.sweep_summary import write_sweep_summary


def _fake_job(sweep: Path, num: int, overrides: list[str], metrics: dict | None) -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))


def test_sweep_summary_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = tmp_path / "sweep"
    common = ["data.path=/x", "trainer.max_steps=10"]
    for num, size, psnr in ((0, 15, 20.0), (1, 17, 24.5), (10, 19, None)):
        metrics = None if psnr is None else {"val/psnr": psnr, "train/samples_per_s": 1e6 * (num + 1)}
        if metrics is not None:  # nested per-view tables and the split name, as train.py writes them
            metrics.update({"val/per_view": {"view": [0], "psnr": [psnr]}, "eval/split": "val"})
        _fake_job(sweep, num, [*common, f"model.net.field.encoding.log2_hashmap_size={size}"], metrics)
    csv_path = write_sweep_summary(sweep, "val/psnr", "maximize")
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "10"]  # numeric order, not "0, 1, 10" by luck of strings
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert rows[1]["sweep_overrides"] == "model.net.field.encoding.log2_hashmap_size=17"
    assert rows[1]["overrides"] == " ".join([*common, "model.net.field.encoding.log2_hashmap_size=17"])
    assert [r["val/psnr"] for r in rows] == ["20.0", "24.5", ""]
    assert list(rows[0])[4] == "val/psnr"  # the optimized metric is the first metric column
    assert "val/per_view" not in rows[0] and rows[0]["eval/split"] == "val"  # no dict-valued columns
    out = capsys.readouterr().out
    assert "24.5" in out and "failed" in out and "summary.csv" in out
    assert write_sweep_summary(tmp_path / "empty") is None


def test_optuna_config(compose_cfg) -> None:
    cfg = compose_cfg("hparams_search=optuna")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert set(sweeper.params) == {"model.net.field.encoding.log2_hashmap_size",
    "model.net.field.encoding.n_levels",
                                   "model.optimizer.lr"}
    assert cfg.optimized_metric == "val/psnr" and cfg.hydra.mode == RunMode.MULTIRUN
    callbacks = cfg.hydra.callbacks
    assert callbacks.multirun_summary._target_ == "nerf_lightning.tracking.sweep_summary.MultirunSummary"
