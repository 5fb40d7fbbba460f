"""The fair held-out protocol (``models/heldout_fit.py``) on a small trained field: a held-out view
with a known pose or exposure error scores lower plainly and recovers after the fit; a view without
error gains nothing; the field is never touched."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn

from models.tiny_training import tiny_module, train_tiny, validate
from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer, so3_exp
from nerf_lightning.models.heldout_fit import HeldoutFit, fit_view
from nerf_lightning.models.metrics import ViewMetrics

SIZE, N_VIEWS = 32, 24
#: the CPU test's budget: 60 steps of 1024 rays (the default, 100 x 4096, is for GPU-sized images)
BUDGET = dict(steps=60, rays=1024)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fit") / "clean"
    path = generate_scene(out, n_views=N_VIEWS, width=SIZE, height=SIZE, supersample=2).parent
    model, _ = train_tiny(path, 200)
    dm = NeRFDataModule(path=str(path), val_split="val", cache_dir=str(path / "cache"))
    dm.setup("validate")
    return model, dm, path


def _psnr(rgb: torch.Tensor, gt: torch.Tensor) -> float:
    return float(ViewMetrics(lpips=False).score(rgb, gt)["psnr"])


def _plain(model, batch) -> float:
    with torch.no_grad():
        view = model.render_view(batch)
    return _psnr(view["rgb"], view["gt"])


def _turned(batch: dict, degrees: float) -> dict:
    """The view as if its given pose were off by ``degrees`` about a fixed axis through its centre."""
    axis = torch.tensor([0.3, -0.8, 0.5], dtype=torch.float64)
    rot = so3_exp(axis / axis.norm() * math.radians(degrees)).float()
    return {**batch, "rays_d": batch["rays_d"] @ rot.T}


@pytest.mark.repro  # a 200-step training and fits of its views: make test-repro
def test_a_pose_error_costs_plainly_and_the_fit_recovers_it_without_touching_the_field(trained) -> None:
    model, dm, _ = trained
    fit = HeldoutFit(enabled=True, exposure=False, **BUDGET)
    before = {k: v.detach().clone() for k, v in model.field.state_dict().items()}
    grads = [None if p.grad is None else p.grad.clone() for p in model.field.parameters()]
    batch = dm.val_batch(0)
    clean = _plain(model, batch)
    wrong = _turned(batch, 3.0)
    plain = _plain(model, wrong)
    fitted = fit_view(model.renderer, model.field, wrong, 1 << 14, fit)
    recovered = _psnr(fitted.rgb, fitted.gt)
    assert plain < clean - 2.0, (plain, clean)  # 3 degrees = 2 pixels at 32 px
    assert recovered > clean - 0.5, (recovered, clean, plain)
    # (part of a small turn is equivalent to a shift of the centre for a distant object: the fitted
    # rotation alone is not the turn, its image is)
    for name, value in model.field.state_dict().items():
        assert torch.equal(value, before[name]), name
    for p, g in zip(model.field.parameters(), grads, strict=True):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)


@pytest.mark.repro  # a 200-step training and fits of its views: make test-repro
def test_a_view_without_error_gains_nothing(trained) -> None:
    model, dm, _ = trained
    fit = HeldoutFit(enabled=True, exposure=False, **BUDGET)
    for view in range(2):
        batch = dm.val_batch(view)
        plain = _plain(model, batch)
        fitted = fit_view(model.renderer, model.field, batch, 1 << 14, fit)
        assert abs(_psnr(fitted.rgb, fitted.gt) - plain) < 0.3, (view, plain)
        assert fitted.rotation_deg < 0.5  # a third of a pixel


@pytest.mark.repro  # a 200-step training and fits of its views: make test-repro
def test_an_exposure_error_is_fitted_on_the_left_half_and_scored_on_the_right(trained) -> None:
    model, dm, _ = trained
    fit = HeldoutFit(enabled=True, pose=False, **BUDGET)
    batch = dm.val_batch(0)
    gain = torch.tensor([0.65, 0.8, 0.7])  # below 1: no clipping, the truth is exact
    # the image under another exposure: its colour scaled over the (unchanged) background
    alpha = batch["alpha"][:, None]
    bg = batch["background"]
    straight = batch["rgb"] - (1 - alpha) * bg
    exposed = {**batch, "rgb": straight * gain + (1 - alpha) * bg}
    w = batch["width"]
    with torch.no_grad():
        view = model.render_view(exposed)
        clean = model.render_view(batch)
    plain_right = _psnr(view["rgb"][:, w // 2 :], view["gt"][:, w // 2 :])
    clean_right = _psnr(clean["rgb"][:, w // 2 :], clean["gt"][:, w // 2 :])
    fitted = fit_view(model.renderer, model.field, exposed, 1 << 14, fit)
    assert fitted.rgb.shape[1] == w - w // 2  # the right half is scored
    recovered = _psnr(fitted.rgb, fitted.gt)
    # a 200-step field at 32 px (about 19 dB): its own errors are of the size of a 0.7 gain's
    assert plain_right < clean_right - 0.5, (plain_right, clean_right)
    assert recovered > clean_right - 0.25, (recovered, clean_right, plain_right)
    # the gain is relative to the field's own colours (a short run renders them a little off): the
    # same fit on the unchanged image gives the field's part
    own = fit_view(model.renderer, model.field, batch, 1 << 14, fit).gain
    ratio = [a / b for a, b in zip(fitted.gain, own, strict=True)]
    # (where this field's silhouette is wrong, pixels it cannot darken pull the gain toward 1: 11 % here)
    assert ratio == pytest.approx(gain.tolist(), rel=0.15), (fitted.gain, own)
    assert all(r < 0.9 for r in ratio)
    # nothing of the right half reaches the fit: a right half changed at will fits the same gain
    spoiled = {**exposed, "rgb": exposed["rgb"].reshape(SIZE, w, 3).clone()}
    spoiled["rgb"][:, w // 2 :] = 0.0
    spoiled["rgb"] = spoiled["rgb"].reshape(-1, 3)
    assert fit_view(model.renderer, model.field, spoiled, 1 << 14, fit).gain == pytest.approx(fitted.gain)


@pytest.mark.repro  # a 200-step training and fits of its views: make test-repro
def test_an_evaluation_after_training_logs_both_numbers(trained) -> None:
    model, _, path = trained
    model.fair_heldout.fit = HeldoutFit(enabled=True, **BUDGET)
    try:
        both = validate(model, path)
    finally:
        model.fair_heldout.fit = HeldoutFit()
    assert both["val/psnr_fitted"] == pytest.approx(both["val/psnr"], abs=1.0)
    plain = validate(model, path)
    assert "val/psnr_fitted" not in plain  # auto: the run learned nothing
    assert both["val/psnr"] == pytest.approx(plain["val/psnr"])


def test_a_validation_while_training_never_fits(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The fair protocol runs in the evaluation passes after ``fit`` (the final evaluation, ``eval``),
    never in a validation pass of ``fit``: the model reads which pass it is in from its trainer."""
    out = tmp_path_factory.mktemp("fit") / "small"
    path = generate_scene(out, n_views=N_VIEWS, width=16, height=16, supersample=1).parent
    model, _ = train_tiny(path, 2, rays=64, heldout_fit={"enabled": True, "steps": 2, "rays": 64})
    dm = NeRFDataModule(path=str(path), val_split="val", cache_dir=str(path / "cache"))
    dm.setup("validate")
    scored = model.fair_heldout.metrics["val"]
    for stage, fitted in ((TrainerFn.FITTING, 0), (TrainerFn.VALIDATING, 1), (TrainerFn.TESTING, 1)):
        model.trainer.state.fn = stage  # the pass a validation runs in: during fit, or after it
        model.render_view(dm.val_batch(0), "val")
        assert scored.update_count == fitted, stage
        model.metrics["val"].reset()
        scored.reset()


def test_a_restored_model_fits_under_the_inference_mode_of_an_evaluation(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``eval`` builds the model, loads its weights and validates under ``torch.inference_mode()``, so
    the first renders (the plain score's) run there; the fit after them needs autograd for the view's
    correction. The restored model scores what the trained one in memory scores (the final evaluation
    of ``train``, whose first renders ran while training), and the field is not touched."""
    out = tmp_path_factory.mktemp("fit") / "restored"
    path = generate_scene(out, n_views=N_VIEWS, width=16, height=16, supersample=1).parent
    components = dict(
        camera_opt=functools.partial(CameraOptimizer, enabled=True),
        appearance=functools.partial(PerViewExposure, enabled=True),
        heldout_fit={"enabled": True, "steps": 3, "rays": 64},
    )
    model, dm = train_tiny(path, 2, rays=64, **components)
    trained = validate(model, path)
    restored = tiny_module(dm, **components)
    restored.load_state_dict(model.state_dict())
    weights = {k: v.clone() for k, v in restored.state_dict().items()}
    calls: list[tuple[bool, bool, bool]] = []  # (inference mode, grad mode, table requires grad)
    restored.field.encoding.register_forward_pre_hook(
        lambda m, _: calls.append(
            (torch.is_inference_mode_enabled(), torch.is_grad_enabled(), m.params.requires_grad)
        )
    )
    evaluated = validate(restored, path)
    assert calls[0] == (True, False, True)  # the plain render first, under inference mode
    fitting = [c for c in calls if c[1]]
    assert fitting and all(c == (False, True, False) for c in fitting)  # autograd on, the field frozen
    assert evaluated["val/psnr_fitted"] == pytest.approx(trained["val/psnr_fitted"], abs=1e-5)
    assert evaluated["val/ssim_fitted"] == pytest.approx(trained["val/ssim_fitted"], abs=1e-6)
    assert evaluated["val/psnr"] == pytest.approx(trained["val/psnr"], abs=1e-5)
    # the fit moved the view's own correction, not the field: its scores differ from the plain ones
    assert evaluated["val/psnr_fitted"] != pytest.approx(evaluated["val/psnr"], abs=1e-3)
    for name, value in restored.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert all(p.grad is None and p.requires_grad for p in restored.field.parameters())


def test_bad_budgets_are_named() -> None:
    with pytest.raises(ValueError, match=r"^model.heldout_fit.steps=0: expected an integer >= 1$"):
        HeldoutFit(steps=0)
    with pytest.raises(ValueError, match=r"^model.heldout_fit.enabled=sometimes: expected one of"):
        HeldoutFit(enabled="sometimes")
    with pytest.raises(ValueError, match=r"^model.heldout_fit.final_factor=1.5: expected a number > 0"):
        HeldoutFit(final_factor=1.5)
