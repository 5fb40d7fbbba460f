"""The fair held-out protocol for runs with per-view corrections: fit a held-out view's own pose and
exposure with the field frozen, then score it.

A run that learns its training views' poses (``camera_opt``) or exposures (``appearance``) moves the
field into the corrected frame and colours, while a held-out view keeps its given pose and the neutral
exposure: the plain held-out metric charges that mismatch to the field. The literature scores such runs
after fitting each held-out view's own correction with the field frozen: test-time pose alignment (BARF,
nerfbaselines) and, for appearance, the NeRF-W protocol (fit on the left half of the image, score on the
right half, so that the exposure never sees the pixels it is scored on).

Per held-out view, with a fixed budget (:class:`HeldoutFit`, ``model.heldout_fit``):

- a single-view :class:`~nerf_lightning.models.camera_opt.CameraOptimizer` (``SO3xR3``, no gauge, no
  L2: one view has no global frame to remove) and a single-view exposure (the log-gain of
  :class:`~nerf_lightning.models.appearance.PerViewExposure` without its mean-over-views gauge: the gain
  is relative to the field's neutral exposure) start at zero;
- ``steps`` Adam steps, each on ``rays`` pixels drawn (seeded) from the fitted region, rendered
  differentiably (``Renderer.render_rays``, no jitter), mean squared error; the rates decay
  log-linearly to ``final_factor`` of their start. The field is frozen meanwhile (its parameters
  require no gradient until the fit ends) and the gradients reach only the correction
  (``torch.autograd.grad``): the field's parameters and their ``.grad`` are never touched. The fit
  runs with autograd on (outside ``torch.inference_mode()``, under which evaluation passes render);
- the whole image is rendered with the fitted correction (``evaluation.render_view``).

With ``exposure`` on, the fit sees the left half of the image (columns ``< W // 2``) and the score is
the right half's; otherwise the fit and the score use the whole image. The plain metric is unchanged and
stays the headline for runs without corrections.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.evaluation import render_view
from nerf_lightning.models.metrics import ViewMetrics
from nerf_lightning.volume.renderer import Renderer

__all__ = ["HeldoutFit", "HeldoutScores", "FittedView", "fit_view"]


@dataclass(frozen=True)
class HeldoutFit:
    """The held-out fit's switch and budget (``model.heldout_fit``).

    Args:
        enabled: ``auto`` (on when the run learns poses or exposures), ``true`` or ``false``. The fit
            runs only in the final evaluation of ``train`` and in ``eval``, never in the validation
            passes during training.
        pose: fit each held-out view's pose.
        exposure: fit each held-out view's per-channel gain (NeRF-W halves).
        steps: Adam steps per view.
        rays: pixels per step.
        pose_lr: starting rate of the pose (radians and NGP units per step, roughly).
        exposure_lr: starting rate of the log-gain.
        final_factor: the rates' factor at the last step (log-linear decay).
        seed: the pixel draws' seed (the same pixels for every run).
    """

    enabled: Annotated[bool | Literal["auto"], Note("auto: with learned poses or exposure")] = "auto"
    pose: bool = True
    exposure: bool = True
    steps: Annotated[int, Range(low=1)] = 100
    rays: Annotated[int, Range(low=1)] = 4096
    pose_lr: Annotated[float, Range(above=0)] = 2e-3
    exposure_lr: Annotated[float, Range(above=0)] = 0.1
    final_factor: Annotated[float, Range(above=0, high=1)] = 0.1
    seed: Annotated[int, Range(low=0)] = 0

    def __post_init__(self) -> None:
        check_arguments(HeldoutFit, vars(self))

    def active(self, corrections: bool) -> bool:
        """Whether the fit runs for a run that learns corrections (``corrections``) or not."""
        on = corrections if self.enabled == "auto" else bool(self.enabled)
        return on and (self.pose or self.exposure)


class HeldoutScores(nn.Module):
    """The fair protocol in a model's evaluation passes: its budget (:attr:`fit`) and each stage's
    scores (:attr:`metrics`, ``val`` and ``test``). The model calls :meth:`update` in the passes that
    run it: the final evaluation of ``train`` and ``eval``, never the validation passes of ``fit``.

    Args:
        fit: ``model.heldout_fit`` (a :class:`HeldoutFit`, its keys, or None: its defaults).
        lpips: the plain metrics' LPIPS setting (``ViewMetrics``).
    """

    def __init__(self, fit: HeldoutFit | dict[str, Any] | None, lpips: bool | str | None = None) -> None:
        super().__init__()
        fit = fit if fit is not None else {}
        self.fit = fit if isinstance(fit, HeldoutFit) else HeldoutFit(**fit)
        # submodules: they follow the model's device (their states gather over the ranks there)
        self.metrics = nn.ModuleDict({"val": ViewMetrics(lpips=lpips), "test": ViewMetrics(lpips=lpips)})

    def update(
        self,
        stage: str,
        renderer: Renderer,
        field: nn.Module,
        batch: dict[str, Any],
        chunk: int,
        corrections: bool,
    ) -> None:
        """Score one held-out view of ``stage`` after its fit, when the protocol is on for a run with
        (``corrections``) or without learned corrections; training views (under
        ``data.val_split=train``) are never fitted."""
        if int(batch.get("train_view", -1)) >= 0 or not self.fit.active(corrections):
            return
        fitted = fit_view(renderer, field, batch, chunk, self.fit)
        self.metrics[stage].update(fitted.rgb, fitted.gt, batch["view"], keep=fitted.keep)


class _SingleViewExposure(PerViewExposure):
    """One view's gain, relative to the field's neutral exposure (no mean-over-views gauge)."""

    def gains(self) -> Tensor:
        return torch.exp(self.log_gain)


@dataclass
class FittedView:
    """A held-out view scored under the fair protocol: ``rgb`` and ``gt`` [H, W', 3] of the scored
    region (the right half with ``exposure``, else the whole image), and the fitted correction's sizes
    (``rotation_deg``, ``translation`` in NGP units, ``gain`` [3]); ``keep`` [H, W'] the region's pixels
    that score, when the view has a mask (masked pixels are neither fitted nor scored)."""

    rgb: Tensor
    gt: Tensor
    rotation_deg: float
    translation: float
    gain: list[float]
    keep: Tensor | None = None


def fit_view(
    renderer: Renderer, field: nn.Module, batch: dict[str, Any], chunk: int, fit: HeldoutFit
) -> FittedView:
    """Fit one held-out view's pose and exposure with ``field`` frozen, and render it with them.

    Args:
        renderer: the run's renderer (its occupancy grid is read, not updated).
        field: the trained field; its parameters get no gradient and no update.
        batch: one whole view (``NeRFDataModule.val_batch`` layout).
        chunk: rays per chunk of the final render.
        fit: the budget.
    """
    h, w = int(batch["height"]), int(batch["width"])
    # evaluation runs under inference mode: the fit needs autograd, and tensors that may be saved for it
    with torch.inference_mode(False), torch.enable_grad(), _frozen(field):
        rays_o, rays_d = batch["rays_o"].clone(), batch["rays_d"].clone()
        target, background = batch["rgb"].clone().float(), batch["background"].clone()
        device = rays_o.device
        camera = (
            CameraOptimizer(1, enabled=True, gauge="none", weight_decay=0.0).to(device) if fit.pose else None
        )
        exposure = _SingleViewExposure(1, enabled=True).to(device) if fit.exposure else None
        groups = []
        if camera is not None:
            groups.append({"params": [camera.adjustment], "lr": fit.pose_lr, "start": fit.pose_lr})
        if exposure is not None:
            groups.append({"params": [exposure.log_gain], "lr": fit.exposure_lr, "start": fit.exposure_lr})
        params = [p for g in groups for p in g["params"]]
        optimizer = torch.optim.Adam(groups, betas=(0.9, 0.99))
        columns = w // 2 if fit.exposure else w
        fitted = torch.arange(h * w).reshape(h, w)[:, :columns].reshape(-1)
        if "keep" in batch:
            fitted = fitted[batch["keep"].cpu()[fitted]]
        generator = torch.Generator().manual_seed(fit.seed)
        for step in range(fit.steps):
            decay = fit.final_factor ** (step / max(fit.steps - 1, 1))
            for group in optimizer.param_groups:
                group["lr"] = group["start"] * decay
            pick = fitted[torch.randint(fitted.numel(), (fit.rays,), generator=generator)].to(device)
            loss = _loss(
                renderer, field, camera, exposure, rays_o[pick], rays_d[pick], background[pick], target[pick]
            )
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            for p, g in zip(params, grads, strict=True):
                p.grad = torch.zeros_like(p) if g is None else g
            optimizer.step()
    with torch.no_grad():
        view = render_view(renderer, field, {**batch, "train_view": 0}, chunk, camera, exposure)
        rotation_deg = translation = 0.0
        if camera is not None:
            x = camera.corrections()[0]
            rotation_deg = float(x[:3].norm()) * 180.0 / math.pi
            translation = float(x[3:].norm())
        gain = exposure.gains()[0].tolist() if exposure is not None else [1.0, 1.0, 1.0]
    scored = slice(w // 2, w) if fit.exposure else slice(0, w)
    keep = view["keep"][:, scored] if "keep" in view else None
    return FittedView(view["rgb"][:, scored], view["gt"][:, scored], rotation_deg, translation, gain, keep)


@contextmanager
def _frozen(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters require no gradient inside (those that did, again after): autograd
    records nothing of them, and no backward computes their gradients."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


def _loss(
    renderer: Renderer,
    field: nn.Module,
    camera: CameraOptimizer | None,
    exposure: PerViewExposure | None,
    rays_o: Tensor,
    rays_d: Tensor,
    background: Tensor,
    target: Tensor,
) -> Tensor:
    """Mean squared error of the corrected rendering of some rays of the view."""
    view_ids = torch.zeros(rays_o.shape[0], dtype=torch.long, device=rays_o.device)
    if camera is not None:
        rays_o, rays_d = camera(view_ids, rays_o, rays_d)
    out = renderer.render_rays(field, rays_o, rays_d, background, jitter=False)
    rgb = out.rgb
    if exposure is not None:
        rgb = exposure(view_ids, rgb, out.opacity, background)
    return (rgb.float() - target).square().mean()
