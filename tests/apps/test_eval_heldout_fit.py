"""``eval fit_heldout=true``: the fair held-out protocol (``models/heldout_fit.py``) on a checkpoint, with
and without learned poses and exposure; its fitted scores are those its training run reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from runs import TINY_TRAIN

from nerf_lightning.apps.eval import evaluate
from nerf_lightning.apps.train import train
from nerf_lightning.run.config import compose_app_config, compose_train_config
from nerf_lightning.run.restore import load_run

pytestmark = pytest.mark.slow

#: a small fit budget (the CPU preset's 30 x 512 is for its 128-pixel images)
FIT = ["model.heldout_fit.steps=4", "model.heldout_fit.rays=256"]
#: learned poses and exposures, and the fit in the final evaluation
CORRECTED = [
    "model.net.camera_opt.enabled=true", "model.net.appearance.enabled=true", "model.heldout_fit.enabled=true"
]  # fmt: skip
#: the budgeted step of a GPU run, sized for the 40-pixel scene (as tests/apps/test_exit_codes.py)
GPU = [
    "accelerator=gpu", "logger=none", "callbacks.progress_bar=null", "model.net.step.sample_budget=4096",
    "model.net.step.march_budget=16384", "model.net.step.n_rays_init=256", "data.batch_size=2048",
    "model.net.renderer.occupancy.resolution=32", "trainer.check_val_every_n_epoch=1000",
    "trainer.enable_model_summary=false",
]  # fmt: skip


@pytest.fixture
def configs(tmp_path: Path):
    def _compose(app: str, *overrides: str, out: str):
        return compose_app_config(app, list(overrides), tmp_path / out)

    yield _compose
    GlobalHydra.instance().clear()


def test_a_checkpoint_without_corrections_gets_fitted_scores(trained_run, configs) -> None:
    """The shared 120-step run learned no pose or exposure, and its final evaluation did not fit; a
    pose fit of its correctly posed views leaves their score where it is (the field is not moved)."""
    run_dir, train_metrics = trained_run
    assert "eval/psnr_fitted" not in train_metrics
    pose_only = [*(f"++{k}" for k in FIT), "++model.heldout_fit.exposure=false"]
    cfg = configs("eval", f"ckpt={run_dir}", "fit_heldout=true", "save_images=false", *pose_only, out="fit")
    doc = evaluate(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert written == json.loads(json.dumps(doc))
    assert doc["n_views"] == 3
    assert doc["val/psnr"] == pytest.approx(train_metrics["val/psnr"], abs=0.05)
    assert doc["val/psnr_fitted"] == pytest.approx(doc["val/psnr"], abs=0.3), doc
    assert 0.0 < doc["val/ssim_fitted"] <= 1.0
    plain = evaluate(configs("eval", f"ckpt={run_dir}", "save_images=false", out="plain"))
    assert "val/psnr_fitted" not in plain  # null: as the run was trained (auto, nothing learned)


def _train_and_evaluate(scene: Path, out: Path, configs, overrides: list[str], evaluation: list[str]):
    """A training with learned corrections and the fit in its final evaluation, then ``eval
    fit_heldout=true`` of its checkpoint on the same views: (training's metrics, eval's metrics.json)."""
    torch.manual_seed(0)
    run_dir = out / "run"
    try:
        metrics = train(compose_train_config([f"data.path={scene}", *overrides, *CORRECTED, *FIT], run_dir))
    finally:
        GlobalHydra.instance().clear()
    precision = load_run(run_dir).node("trainer").precision  # eval scores at the training's precision
    evaluation = [*evaluation, f"trainer.precision={precision}", "fit_heldout=true", "save_images=false"]
    return metrics, evaluate(configs("eval", f"ckpt={run_dir}", *evaluation, out="eval"))


def test_eval_fits_as_the_training_run_did(tiny_scene: Path, tmp_path: Path, configs) -> None:
    """Same checkpoint, views, seed and budget: eval's fitted scores are the final evaluation's (the
    same arithmetic on one CPU thread count: equal to float rounding)."""
    trained, doc = _train_and_evaluate(
        tiny_scene, tmp_path, configs, [*TINY_TRAIN, "trainer.max_steps=20"], ["accelerator=cpu"]
    )
    assert doc["views"] and [v["name"] + ".png" for v in doc["views"]] == trained["eval/views"]
    assert doc["val/psnr"] == pytest.approx(trained["eval/psnr"], abs=1e-6)
    assert doc["val/psnr_fitted"] == pytest.approx(trained["eval/psnr_fitted"], abs=1e-6)
    assert doc["val/ssim_fitted"] == pytest.approx(trained["eval/ssim_fitted"], abs=1e-7)
    assert doc["val/psnr_fitted"] != pytest.approx(doc["val/psnr"], abs=1e-3)  # the fit did something


@pytest.mark.cuda
def test_eval_fits_as_the_training_run_did_on_a_gpu(tiny_scene: Path, tmp_path: Path, configs) -> None:
    """The GPU path: CUDA kernels, the graphed step, the training's precision (bf16-mixed on Ampere+).
    The kernels' atomic sums are not bit-reproducible from one call to the next: 0.01 dB."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    trained, doc = _train_and_evaluate(
        tiny_scene, tmp_path, configs, [*GPU, "trainer.max_steps=60"], ["accelerator=gpu"]
    )
    assert [v["name"] + ".png" for v in doc["views"]] == trained["eval/views"]
    assert doc["val/psnr"] == pytest.approx(trained["eval/psnr"], abs=0.01)
    assert doc["val/psnr_fitted"] == pytest.approx(trained["eval/psnr_fitted"], abs=0.01)
    assert doc["val/ssim_fitted"] == pytest.approx(trained["eval/ssim_fitted"], abs=1e-3)
