"""Gradient accumulation: k micro-batches of B/k rays give the gradient of one batch of B rays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import lightning as L
import pytest
import torch

from nerf_lightning.apps.train import build_datamodule, build_model
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.data.synthetic import generate_scene

SMALL = [
    "accelerator=cpu",
    "logger=none",
    "callbacks=none",
    "model.net.step.sample_budget=null",
    "model.net.step.jitter=false",
    "model.net.renderer.occupancy.resolution=16",
    "model.net.field.encoding.n_levels=4",
    "model.net.field.encoding.log2_hashmap_size=12",
    "model.net.field.encoding.max_resolution=64",
    "model.net.renderer.step_size=0.02",
    "model.net.renderer.max_samples_per_ray=64",
    "+trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.max_steps=2",
]


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scene") / "acc"
    generate_scene(out, n_views=8, width=24, height=24, supersample=1)
    return out


class _Grads(L.Callback):
    """The gradient of every optimizer step, as seen by the optimizer."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self.steps.append([p.grad.detach().clone() for p in pl_module.parameters()])


def _first_step_grads(scene: Path, compose_cfg, accumulate: int, batch: RayBatch):
    cfg = compose_cfg(f"data.path={scene}", f"accumulate_grad_batches={accumulate}", *SMALL)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    n = batch.n_rays // accumulate

    def micro_batch(step_index: Any, dataloader_idx: int) -> RayBatch | dict[str, Any]:
        if not dm.trainer.training:
            return dm.val_batch(int(step_index))
        i = int(step_index) % accumulate
        return batch.rows(i * n, (i + 1) * n)

    dm.on_after_batch_transfer = micro_batch
    torch.manual_seed(0)
    model, _ = build_model(cfg, dm)  # as the train app builds it
    grads = _Grads()
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=[grads], logger=False)
    trainer.fit(model, datamodule=dm)
    assert len(grads.steps) == 2 and trainer.global_step == 2
    return grads.steps[0]


def test_accumulated_micro_batches_equal_one_batch(scene: Path, compose_cfg) -> None:
    torch.set_num_threads(2)
    cfg = compose_cfg(f"data.path={scene}", *SMALL)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    dm.feedback.alpha_targets = True  # the batch carries the opacity loss's target, as the model asks
    torch.manual_seed(1)
    batch = dm.train_batch(256)
    assert batch.alpha is not None
    whole = _first_step_grads(scene, compose_cfg, 1, batch)
    for k in (2, 4):
        split = _first_step_grads(scene, compose_cfg, k, batch)
        for a, b in zip(split, whole, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-9)
    assert any(float(g.abs().max()) > 0 for g in whole)
