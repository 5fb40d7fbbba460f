"""Restoring a checkpoint written before classes moved: its stored ``_target_`` paths are mapped."""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from nerf_lightning.run.checkpoint_callbacks import CHECKPOINT_KEY
from nerf_lightning.run.config import compose_train_config
from nerf_lightning.run.model_node import instantiate_model
from nerf_lightning.run.restore import MOVED_TARGETS, load_run

# Where these classes lived when a checkpoint stored them (config key -> import path of that version).
OLD_TARGETS = {
    "callbacks.last_checkpoint": "nerf_lightning.callbacks.checkpointing.LastCheckpoint",
    "callbacks.prometheus": "nerf_lightning.callbacks.prometheus.PrometheusExporter",
    "logger.csv": "nerf_lightning.utils.tracking.CSVLogger",
    "logger.tensorboard": "nerf_lightning.utils.tracking.TensorBoardLogger",
    "logger.wandb": "nerf_lightning.utils.tracking.WandbLogger",
}


def _composed(overrides: list[str], folder: Path, aabb_scale: int) -> tuple[dict, torch.nn.Module]:
    """The plain run config (without ``hydra``) of ``overrides`` and the model it builds."""
    cfg = compose_train_config(overrides, folder)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
        model = instantiate_model(cfg.model, {"aabb_scale": aabb_scale})
    finally:
        GlobalHydra.instance().clear()
    plain.pop("hydra")
    return plain, model


def _old_checkpoint(path: Path) -> dict[str, str]:
    """A checkpoint as the version before the move wrote it; returns today's target of each moved key."""
    plain, model = _composed(["experiment=cpu", "logger=many_loggers"], path.parent, aabb_scale=1)
    today = {}
    for key, old in OLD_TARGETS.items():
        group, name = key.split(".")
        today[key] = plain[group][name]["_target_"]
        plain[group][name]["_target_"] = old
    section = {"config": plain, "instantiate_kwargs": {"model": {"aabb_scale": 1}}}
    torch.save({"state_dict": model.state_dict(), "global_step": 5, CHECKPOINT_KEY: section}, path)
    return today


def test_a_checkpoint_with_old_target_paths_restores(tmp_path: Path) -> None:
    ckpt = tmp_path / "old.ckpt"
    today = _old_checkpoint(ckpt)
    assert all(today[key] != old for key, old in OLD_TARGETS.items())  # every one of them did move
    run = load_run(ckpt)
    for key in OLD_TARGETS:
        target = OmegaConf.select(run.config, f"{key}._target_")
        assert target == today[key], key
        hydra.utils.get_class(target)  # importable where the config now says
    assert run.config.model._target_ == "nerf_lightning.models.module.NeRFModule"  # unmoved: kept
    model = run.build_model()  # the weights fit the model rebuilt from the mapped config
    assert run.global_step == 5 and not model.training


def test_moved_targets_point_at_importable_objects() -> None:
    for old, new in MOVED_TARGETS.items():
        renamed = old.endswith(".budgeted_step")  # one step path: the factory's new name says so
        assert renamed or old.rsplit(".", 1)[1] == new.rsplit(".", 1)[1], (old, new)  # moved, not renamed
        assert callable(hydra.utils.get_object(new)), new


def test_a_checkpoint_of_the_flat_model_layout_restores(tmp_path: Path) -> None:
    """A run config whose model keys were flat (``model.grid_resolution``, ``model.sample_budget``, ...)
    rebuilds the same model: its values land in the renderer and step nodes."""
    overrides = [
        "experiment=cpu",
        "model.net.renderer.occupancy.resolution=16",
        "model.net.renderer.near_plane=0.1",
    ]
    plain, model = _composed(overrides, tmp_path, aabb_scale=2)
    renderer, step = plain["model"]["net"].pop("renderer"), plain["model"]["net"].pop("step")
    grid = renderer.pop("occupancy")
    flat = {f"grid_{k}": v for k, v in grid.items() if k in ("update_every", "warmup_steps", "decay")}
    flat |= {"grid_resolution": grid["resolution"], "grid_threshold": grid["density_threshold"]}
    # the renderer's keys of that layout (reuse_features came after it, under model.net only)
    flat |= {k: v for k, v in renderer.items() if not k.startswith("_") and k != "reuse_features"}
    # the step's keys of that layout (its later keys, min_rays and adapt_momentum, come from ngp.yaml)
    flat |= {k: v for k, v in step.items() if k in ("sample_budget", "march_budget", "n_rays_init")}
    plain["model"].update(flat)
    section = {"config": plain, "instantiate_kwargs": {"model": {"aabb_scale": 2}}}
    ckpt = tmp_path / "flat.ckpt"
    torch.save({"state_dict": model.state_dict(), "global_step": 3, CHECKPOINT_KEY: section}, ckpt)

    run = load_run(ckpt)
    assert (
        "grid_resolution" not in run.config.model and run.config.model.net.renderer.occupancy.resolution == 16
    )
    restored = run.build_model()  # strict: the grid has the checkpoint's 16^3 cells
    assert restored.renderer.near_plane == 0.1 and restored.occupancy.resolution == 16
    assert not restored.train_step_fn.budgeted  # the CPU preset's sample_budget: null
