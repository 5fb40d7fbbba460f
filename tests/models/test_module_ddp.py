"""Two-rank CPU DDP training (Lightning ``ddp_fork``, gloo): the state that decides which samples exist
is identical on both ranks after training, as DESIGN.md requires, although each rank draws its own rays
and evaluates its own share of the grid's cells.

The reduction itself (MAX, not SUM) is checked value by value in
``tests/render/test_occupancy.py::test_sync_all_reduces_the_max_over_two_gloo_ranks``; this test checks
that training actually synchronizes: the occupancy grid after its updates, the loss-weighted view
sampler's statistics, and the parameters, the learned per-view pose corrections and exposures included
(ordinary parameters: the strategy all-reduces their gradients).
"""

from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist

from models.tiny_training import fit_on_one_thread
from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.sampler import LossWeightedRaySampler
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.field import NGPField
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import build_renderer
from tests.nerf_modules import nerf_module


class _SaveRankState(L.Callback):
    """Each rank writes its module state, sampler weights and the positions each occupancy update
    evaluated on it at the end of training."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.evaluated: list[int] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        grid = pl_module.occupancy
        update = grid.update

        def counted(step: int, density_fn, **kwargs):  # noqa: ANN001, ANN202
            seen: list[int] = []
            update(step, lambda p: seen.append(p.shape[0]) or density_fn(p), **kwargs)
            self.evaluated.append(sum(seen))

        grid.update = counted

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        sampler = trainer.datamodule.sampler
        torch.save(
            {
                "state": state,
                "view_probs": sampler.view_probabilities().clone(),
                "step": trainer.global_step,
                "evaluated": self.evaluated,
            },
            self.out_dir / f"rank{trainer.global_rank}.pt",
        )


def test_two_rank_training_keeps_grid_sampler_and_weights_identical(tmp_path: Path) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    scene = generate_scene(tmp_path / "scene", n_views=8, width=16, height=12, supersample=1).parent
    loss_weighted = functools.partial(LossWeightedRaySampler, warmup_steps=0, update_every=2, alpha=2.0)
    dm = NeRFDataModule(
        path=str(scene),
        batch_size=64,
        steps_per_epoch=8,
        sampler="loss_weighted",
        samplers={"loss_weighted": loss_weighted},
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup("fit")
    model = nerf_module(
        field=functools.partial(
            NGPField,
            encoding=dict(n_levels=2, log2_hashmap_size=8, max_resolution=32),
            hidden_dim=16,
        ),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        aabb_scale=dm.aabb_scale,
        backend="torch",
        renderer=functools.partial(
            build_renderer,
            # updates after steps 2 (warm-up: all cells), 4 and 6 (sampled cells)
            occupancy=functools.partial(OccupancyGrid, resolution=8, update_every=2, warmup_steps=3),
            step_size=0.05,
            max_samples_per_ray=32,
        ),
        save_val_images=False,
        camera_opt=functools.partial(CameraOptimizer, enabled=True),
        appearance=functools.partial(PerViewExposure, enabled=True),
        n_train_views=dm.n_train_views,
        train_poses=dm.train_poses,
        feedback=dm.feedback,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        max_steps=6,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_SaveRankState(tmp_path)],
    )
    # one intra-op thread from before the fork on: the ranks share two cores
    fit_on_one_thread(trainer, model, dm)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert r0["step"] == r1["step"] == 6

    for key in ("renderer.occupancy.density_grid", "renderer.occupancy.binaries"):
        assert torch.equal(r0["state"][key], r1["state"][key]), f"{key} differs between the ranks"
    grid = r0["state"]["renderer.occupancy.density_grid"]
    assert (grid > 0).any() and not r0["state"]["renderer.occupancy.binaries"].all()  # it was updated
    # each rank evaluated its half of the cells: at warm-up every cell once over both ranks, then half of
    # the G^3 / 4 uniform and G^3 / 4 occupied draws of each cascade
    cells = grid.numel()
    assert len(r0["evaluated"]) == len(r1["evaluated"]) == 3
    assert r0["evaluated"][0] + r1["evaluated"][0] == cells
    assert r0["evaluated"][1:] == r1["evaluated"][1:] == [cells // 4] * 2

    assert torch.equal(r0["view_probs"], r1["view_probs"])
    uniform = torch.full_like(r0["view_probs"], 1.0 / r0["view_probs"].numel())
    assert not torch.allclose(r0["view_probs"], uniform, rtol=1e-3)  # the losses reached the sampler

    for key in ("camera_opt.adjustment", "appearance.log_gain"):  # trained, from the rays of both ranks
        assert float(r0["state"][key].abs().max()) > 0, key
    for key, value in r0["state"].items():
        torch.testing.assert_close(r1["state"][key], value, rtol=0, atol=0, msg=key)
