"""The LightningModule: rays -> packed samples -> field -> compositing -> loss, and validation renders."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nerf_lightning.models.field import NGPField
from nerf_lightning.models.metrics import ViewMetrics
from nerf_lightning.render.occupancy import OccupancyGrid
from nerf_lightning.render.renderer import Renderer

log = logging.getLogger(__name__)


class NeRFModule(L.LightningModule):
    """instant-ngp NeRF training as a LightningModule.

    Args:
        field: factory (Hydra ``_partial_``) of the radiance field, called with ``aabb_scale``.
        optimizer: factory of the optimizer, called with parameter groups.
        scheduler: factory called with ``(optimizer, total_steps)``; stepped every optimizer step.
        aabb_scale: outer box size (from the capture; see ``data/types.py``).
        grid_resolution: occupancy-grid cells per side per cascade.
        grid_update_every / grid_warmup_steps / grid_decay / grid_threshold: occupancy schedule
            (instant-ngp: every 16 steps, all cells during the first 256 steps, EMA decay 0.95).
        step_size: minimum marching step in NGP units (instant-ngp: sqrt(3)/1024).
        cone_angle: step grows as t * cone_angle (0 = constant). ``None`` follows instant-ngp:
            ``large_scene_cone_angle`` (1/256) when ``aabb_scale > 1`` (real captures with
            background), else 0.
        max_samples_per_ray: per-ray cap on kept samples.
        near_plane: samples start this far (NGP units) from the ray origin (0: at the camera).
        early_stop_eps: transmittance below which a ray stops contributing.
        compact_samples: drop samples behind the early-termination point before the differentiable
            pass (see ``Renderer``).
        loss: ``huber`` (instant-ngp's NeRF default, delta 0.1) or ``mse``.
        val_chunk: rays per chunk when rendering validation images.
        ops_backend: ``auto | cuda | torch`` for the ray ops.
        save_val_images: write ``val/view{v}_step{s}.png`` (GT | prediction | depth | error).
        lpips: LPIPS in the evaluation metrics: ``null`` (VGG, as nerfacc, when its weights are local),
            ``false``, or a torchmetrics net name (``vgg``, ``alex``, ``squeeze``).

    Evaluation (``validation_step`` / ``test_step``, one whole held-out image per batch): PSNR, SSIM
    (and LPIPS) per image, logged at the end of the pass as their means over the views
    (``val/psnr`` ... and ``test/psnr`` ...; see ``models/metrics.py``). The full result of the last
    pass of each stage, per-view numbers included, is kept in :attr:`eval_results`.
    """

    def __init__(
        self,
        field: Callable[..., NGPField],
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        aabb_scale: int = 1,
        grid_resolution: int = 128,
        grid_update_every: int = 16,
        grid_warmup_steps: int = 256,
        grid_decay: float = 0.95,
        grid_threshold: float = 0.01 * 1024 / math.sqrt(3),
        step_size: float = math.sqrt(3) / 1024,
        cone_angle: float | None = None,
        large_scene_cone_angle: float = 1.0 / 256,
        max_samples_per_ray: int = 1024,
        near_plane: float = 0.0,
        early_stop_eps: float = 1e-4,
        compact_samples: bool = True,
        loss: str = "huber",
        huber_delta: float = 0.1,
        val_chunk: int = 1 << 15,
        ops_backend: str = "auto",
        save_val_images: bool = True,
        lpips: bool | str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        if loss not in ("huber", "mse"):
            raise ValueError(f"model.loss must be 'huber' or 'mse', got {loss!r}")
        self.field = field(aabb_scale=aabb_scale)
        self.renderer = Renderer(
            OccupancyGrid(aabb_scale=aabb_scale, resolution=grid_resolution),
            step_size=step_size,
            cone_angle=(large_scene_cone_angle if aabb_scale > 1 else 0.0)
            if cone_angle is None
            else cone_angle,
            max_samples_per_ray=max_samples_per_ray,
            near_plane=near_plane,
            early_stop_eps=early_stop_eps,
            compact_samples=compact_samples,
            ops_backend=ops_backend,
        )
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.val_metrics = ViewMetrics(lpips=lpips)
        self.test_metrics = ViewMetrics(lpips=lpips)
        #: stage ("val" / "test") -> last ViewMetrics.compute() result of that stage (rank 0 has all views)
        self.eval_results: dict[str, dict[str, Any]] = {}
        # Device-side counters read by the throughput callback (no host sync in the step).
        self.register_buffer("rays_seen", torch.zeros((), dtype=torch.float64), persistent=False)
        self.register_buffer("samples_seen", torch.zeros((), dtype=torch.float64), persistent=False)

    @property
    def occupancy(self) -> OccupancyGrid:
        """The renderer's occupancy grid (one instance; saved under ``renderer.occupancy.*``)."""
        return self.renderer.occupancy

    # ---------------------------------------------------------------------------- training
    def on_fit_start(self) -> None:
        # Same initial weights everywhere (the strategy broadcasts them), different rays per rank.
        seed = torch.initial_seed() % (2**31)
        torch.manual_seed(seed + 1000 * self.global_rank)
        dm = self.trainer.datamodule
        ts = getattr(dm, "train_set", None)
        if ts is not None and self.global_step == 0:
            self.occupancy.mark_invisible_cells(
                ts.poses.to(self.device),
                ts.intrinsics.to(self.device),
                ts.widths.to(self.device),
                ts.heights.to(self.device),
            )

    def _loss(self, pred: Tensor, target: Tensor) -> Tensor:
        """Per-ray loss [R]."""
        if self.hparams.loss == "mse":
            return ((pred - target) ** 2).mean(dim=-1)
        return F.huber_loss(pred, target, reduction="none", delta=self.hparams.huber_delta).mean(dim=-1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        out = self.renderer.render_rays(
            self.field, batch["rays_o"], batch["rays_d"], batch["background"], jitter=True
        )
        per_ray = self._loss(out["rgb"], batch["rgb"])
        loss = per_ray.mean()
        sampler = getattr(self.trainer.datamodule, "sampler", None)
        if sampler is not None:
            sampler.update(batch["view_ids"], batch["px"], batch["py"], per_ray.detach())
        self.rays_seen += per_ray.shape[0]
        self.samples_seen += out["n_samples"].detach().to(torch.float64)
        with torch.no_grad():
            mse = ((out["rgb"].detach() - batch["rgb"]) ** 2).mean()
        # Logged tensors are read by the logger every `log_every_n_steps`, not synchronized here.
        self.log("train/loss", loss)
        self.log("train/psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)))
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches != 0:
            return  # only after a real optimizer step
        step = self.global_step
        sampler = getattr(self.trainer.datamodule, "sampler", None)
        if sampler is not None:
            sampler.step(step)
        hp = self.hparams
        if step % hp.grid_update_every == 0:
            self.occupancy.update(
                step,
                self.field.density,
                warmup_steps=hp.grid_warmup_steps,
                decay=hp.grid_decay,
                threshold=hp.grid_threshold,
            )
            if self.trainer.world_size > 1:
                self.occupancy.sync_(_all_reduce_max)

    # -------------------------------------------------------------------------- evaluation
    def render_view(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        """Render one whole held-out view batch (``NeRFDataModule.val_batch`` layout).

        Returns:
            prediction [H, W, 3] in [0, 1] over the batch's background, ground truth [H, W, 3] and
            depth [H, W] (weighted sample distance, not normalized by opacity).
        """
        h, w = batch["height"], batch["width"]
        out = self.renderer.render_image(
            self.field, batch["rays_o"], batch["rays_d"], batch["background"], chunk=self.hparams.val_chunk
        )
        pred = out["rgb"].reshape(h, w, 3).clamp(0, 1)
        return pred, batch["rgb"].reshape(h, w, 3), out["depth"].reshape(h, w)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        pred, gt, depth = self.render_view(batch)
        self.val_metrics.update(pred, gt, batch["view"])
        if self.hparams.save_val_images and batch_idx == 0 and self.trainer.is_global_zero:
            self._save_panel(batch["view"], gt, pred, depth)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        pred, gt, _ = self.render_view(batch)
        self.test_metrics.update(pred, gt, batch["view"])

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_metrics)

    def _log_eval(self, stage: str, metrics: ViewMetrics) -> None:
        """Log the means of one evaluation pass (already gathered over ranks) and keep the result."""
        if not metrics.update_count:
            return  # no evaluation batch ran (e.g. limit_val_batches=0)
        result = metrics.compute()
        metrics.reset()
        self.eval_results[stage] = result
        for name in ("psnr", "ssim", "lpips"):
            if name in result:
                # every rank holds the gathered mean, so no further reduction
                self.log(f"{stage}/{name}", result[name], prog_bar=name == "psnr", sync_dist=False)

    def _save_panel(self, view: int, gt: Tensor, pred: Tensor, depth: Tensor) -> None:
        """GT | prediction | depth | error as one PNG under ``<run>/val/``, and on the logger."""
        import imageio.v3 as iio

        d = depth / depth.max().clamp_min(1e-6)
        err = (pred - gt).abs().mean(-1).clamp(0, 0.25) / 0.25
        panel = torch.cat([gt, pred, d[..., None].expand(-1, -1, 3), err[..., None].expand(-1, -1, 3)], dim=1)
        image = (panel.detach().float().cpu().numpy() * 255).round().astype(np.uint8)
        run_dir = Path(self.trainer.default_root_dir)
        out_dir = run_dir / "val"
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"view{view:03d}_step{self.global_step:06d}.png"
        iio.imwrite(path, image)
        for logger in self.loggers:
            log_image = getattr(logger, "log_image", None)
            if callable(log_image):
                log_image(
                    key="val/panel",
                    images=[image],
                    step=self.global_step,
                    caption=["GT | prediction | depth | error"],
                )

    # --------------------------------------------------------------------------- optimizer
    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        total = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 10_000
        scheduler = self.scheduler_factory(optimizer=optimizer, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _all_reduce_max(tensor: Tensor) -> None:
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
