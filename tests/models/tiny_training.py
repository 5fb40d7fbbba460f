"""A small CPU training of ``NeRFModule`` on a generated capture (shared by the held-out fit and the
damage-recovery tests): the CPU preset's pipeline at 24-32 pixels, one intra-op thread."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import torch

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import build_renderer
from tests.nerf_modules import nerf_module

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


def train_tiny(
    path: Path, steps: int, rays: int = 512, seed: int = 0, **components: Any
) -> tuple[NeRFModule, NeRFDataModule]:
    """``steps`` steps of ``rays`` rays on the capture at ``path``; ``components``: NeRFModule's
    ``camera_opt`` / ``appearance`` / ``heldout_fit``."""
    torch.manual_seed(seed)
    dm = NeRFDataModule(path=str(path), batch_size=rays, steps_per_epoch=steps, cache_dir=str(path / "cache"))
    dm.setup("fit")
    model = tiny_module(dm, **components)
    trainer = L.Trainer(
        max_steps=steps, enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0, **QUIET
    )
    fit_on_one_thread(trainer, model, dm)
    return model, dm


def fit_on_one_thread(trainer: L.Trainer, model: L.LightningModule, dm: L.LightningDataModule) -> None:
    """``trainer.fit`` with one intra-op thread, the count before restored after: tiny steps on a shared
    2-core machine run faster so, and a forked rank starts from a thread count that survives the fork
    (OpenMP's pool does not)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.fit(model, datamodule=dm)
    finally:
        torch.set_num_threads(threads)


def tiny_module(dm: NeRFDataModule, **components: Any) -> NeRFModule:
    """The small model of :func:`train_tiny` for the capture ``dm`` has set up for ``fit``, untrained
    (``components`` as there)."""
    return nerf_module(
        field=functools.partial(
            NGPField,
            encoding=dict(n_levels=8, log2_hashmap_size=14, max_resolution=256),
            hidden_dim=32,
        ),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2, betas=(0.9, 0.99), eps=1e-15),
        aabb_scale=dm.aabb_scale,
        renderer=functools.partial(
            build_renderer,
            occupancy=functools.partial(OccupancyGrid, resolution=32, warmup_steps=16),
            step_size=0.0135,
            max_samples_per_ray=128,
            near_plane=0.0,
            gradient_scaling_distance=None,
        ),
        backend="torch",
        alpha_weight=0.0,
        save_val_images=False,
        lpips=False,
        n_train_views=dm.n_train_views,
        train_poses=dm.train_poses,
        photograph=dm.is_photograph,
        feedback=dm.feedback,
        **components,
    )


def validate(model: NeRFModule, path: Path, split: str = "val") -> dict[str, float]:
    """The logged means of one validation pass over the ``data.val_split=split`` views, after training
    (with the held-out fit when ``model.fair_heldout.fit`` is active, as the final evaluation runs it)."""
    dm = NeRFDataModule(path=str(path), val_split=split, cache_dir=str(path / "cache"))
    trainer = L.Trainer(**QUIET)
    return {k: float(v) for k, v in trainer.validate(model, datamodule=dm, verbose=False)[0].items()}
