"""Rendering and recording one held-out view for evaluation (``NeRFModule``'s validation and test steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from nerf_lightning.models.metrics import ngp_composite, srgb_over_black
from nerf_lightning.volume.renderer import Renderer

__all__ = ["render_view", "save_panel"]


def render_view(
    renderer: Renderer,
    field: nn.Module,
    batch: dict[str, Any],
    chunk: int,
    camera_opt: nn.Module | None = None,
    appearance: nn.Module | None = None,
) -> dict[str, Tensor]:
    """Render one whole held-out view batch (``NeRFDataModule.val_batch`` layout).

    Held-out and novel views are rendered with their given poses and the neutral exposure (nothing
    applied, see ``models/appearance.py``); a training view (``batch["train_view"]`` >= 0, e.g. under
    ``data.val_split=train``) with its own learned pose correction (``camera_opt``) and exposure
    (``appearance``).

    Returns:
        ``rgb`` prediction [H, W, 3] in [0, 1] over the batch's background, ``gt`` ground truth
        [H, W, 3], ``depth`` [H, W] (weighted sample distance, not normalized by opacity), ``opacity``
        [H, W] and ``ngp``: (prediction, ground truth) as instant-ngp scores them
        (``metrics.ngp_composite``) and ``black``: the pair over black in sRGB
        (``metrics.srgb_over_black``), when the batch carries the image's ``alpha``; ``keep`` [H, W]
        bool, the pixels that score, when the view has a mask.
    """
    h, w = batch["height"], batch["width"]
    rays_o, rays_d, background = batch["rays_o"], batch["rays_d"], batch["background"]
    train_view = int(batch.get("train_view", -1))
    view_ids = torch.full((rays_o.shape[0],), max(train_view, 0), dtype=torch.long, device=rays_o.device)
    if train_view >= 0 and camera_opt is not None:
        rays_o, rays_d = camera_opt(view_ids, rays_o, rays_d)
    out = renderer.render_image(field, rays_o, rays_d, background, chunk=chunk)
    if train_view >= 0 and appearance is not None:
        out["rgb"] = appearance(view_ids, out["rgb"], out["opacity"], background)
    view = {
        "rgb": out["rgb"].reshape(h, w, 3).clamp(0, 1),
        "gt": batch["rgb"].reshape(h, w, 3),
        "depth": out["depth"].reshape(h, w),
        "opacity": out["opacity"].reshape(h, w),
    }
    if "keep" in batch:
        view["keep"] = batch["keep"].reshape(h, w)
    if "alpha" in batch:
        background, alpha = batch["background"][0], batch["alpha"].reshape(h, w)
        for key, composite in (("ngp", ngp_composite), ("black", srgb_over_black)):
            pred = composite(view["rgb"], view["opacity"], background)
            view[key] = (pred, composite(view["gt"], alpha, background))
    return view


def save_panel(
    run_dir: Path, view: int, step: int, gt: Tensor, pred: Tensor, depth: Tensor, loggers: list[Any]
) -> Path:
    """GT | prediction | depth | error as one PNG, ``<run_dir>/val/view{view}_step{step}.png``, and as
    ``val/panel`` on each logger that logs images."""
    import imageio.v3 as iio

    d = depth / depth.max().clamp_min(1e-6)
    err = (pred - gt).abs().mean(-1).clamp(0, 0.25) / 0.25
    panel = torch.cat([gt, pred, d[..., None].expand(-1, -1, 3), err[..., None].expand(-1, -1, 3)], dim=1)
    image = (panel.detach().float().cpu().numpy() * 255).round().astype(np.uint8)
    out_dir = run_dir / "val"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"view{view:03d}_step{step:06d}.png"
    iio.imwrite(path, image)
    for logger in loggers:
        log_image = getattr(logger, "log_image", None)
        if callable(log_image):
            log_image(key="val/panel", images=[image], step=step, caption=["GT | prediction | depth | error"])
    return path
