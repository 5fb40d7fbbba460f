"""The flat model keys of earlier configs still work, on the command line and in composed configs."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from nerf_lightning.apps.entry import normalize_argv
from nerf_lightning.run.config import KEY_ALIASES, alias_override, compose_train_config


def test_old_keys_map_to_the_nodes() -> None:
    assert alias_override("model.near_plane=0.0") == "model.renderer.near_plane=0.0"
    assert alias_override("++model.grid_resolution=32") == "++model.renderer.occupancy.resolution=32"
    assert alias_override("~model.sample_budget") == "~model.step.sample_budget"
    assert alias_override("model.grid_threshold=1") == "model.renderer.occupancy.density_threshold=1"
    # a key is aliased only as a whole: neither a longer key nor a value is touched
    assert alias_override("model.step_size_x=1") == "model.step_size_x=1"
    assert alias_override("data.path=/x/model.near_plane") == "data.path=/x/model.near_plane"
    assert alias_override("model.renderer.near_plane=0") == "model.renderer.near_plane=0"
    assert normalize_argv(["model.ops_backend=torch"], open_nodes=("model",)) == [
        "++model.renderer.ops_backend=torch"
    ]


def test_every_alias_names_a_key_of_the_config(tmp_path: Path) -> None:
    cfg = compose_train_config([], tmp_path)
    for old, new in KEY_ALIASES.items():
        node, _, key = new.rstrip(".").rpartition(".")
        assert key in OmegaConf.select(cfg, node), (old, new)


def test_composed_configs_read_old_spellings(tmp_path: Path) -> None:
    cfg = compose_train_config(
        ["model.grid_resolution=32", "model.near_plane=0.0", "model.gradient_scaling_distance=null",
         "model.sample_budget=null", "model.ops_backend=torch", "model.step_size=0.03",
         "model.field.encoding.backend=torch"],
        tmp_path,
    )  # fmt: skip
    model = cfg.model
    assert model.renderer.occupancy.resolution == 32 and model.renderer.near_plane == 0.0
    assert model.renderer.gradient_scaling_distance is None and model.step.sample_budget is None
    module = hydra.utils.instantiate(model, aabb_scale=1)
    assert module.occupancy.resolution == 32 and module.renderer.step_size == pytest.approx(0.03)
    assert module.renderer.near_plane == 0.0 and module.renderer.gradient_scaling_distance is None
    assert not module.train_step_fn.budgeted  # no sample budget: data.batch_size rays per step


def test_the_default_model_is_built_from_its_nodes(tmp_path: Path) -> None:
    overrides = ["model.field.encoding.backend=torch", "model.renderer.ops_backend=torch"]
    cfg = compose_train_config(overrides, tmp_path)
    module = hydra.utils.instantiate(cfg.model, aabb_scale=4)
    assert module.occupancy.aabb_scale == 4 and module.occupancy.resolution == 128
    assert module.occupancy.update_every == 16 and module.occupancy.warmup_steps == 256
    assert module.renderer.cone_angle == pytest.approx(1 / 256)  # null: instant-ngp's for aabb_scale > 1
    step = module.train_step_fn
    assert step.sample_budget == 1 << 18 and step.march_budget == 1 << 20 and int(step.n_active) == 4096
