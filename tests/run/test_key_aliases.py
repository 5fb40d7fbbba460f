"""The flat model keys of earlier configs still work, on the command line and in composed configs.

The old spellings are read from ``Formerly`` on the parameters the config reaches (run/config_tree.py)."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from nerf_lightning.apps.entry import normalize_argv
from nerf_lightning.run.config import alias_override, compose_train_config
from nerf_lightning.run.config_tree import key_aliases

#: every old spelling the project has accepted since the model's nodes were introduced, written out
EXPECTED_ALIASES = {
    "model.encoding.": "model.field.encoding.",
    "model.grid_resolution": "model.renderer.occupancy.resolution",
    "model.grid_update_every": "model.renderer.occupancy.update_every",
    "model.grid_warmup_steps": "model.renderer.occupancy.warmup_steps",
    "model.grid_decay": "model.renderer.occupancy.decay",
    "model.grid_threshold": "model.renderer.occupancy.density_threshold",
    "model.step_size": "model.renderer.step_size",
    "model.cone_angle": "model.renderer.cone_angle",
    "model.large_scene_cone_angle": "model.renderer.large_scene_cone_angle",
    "model.max_samples_per_ray": "model.renderer.max_samples_per_ray",
    "model.near_plane": "model.renderer.near_plane",
    "model.gradient_scaling_distance": "model.renderer.gradient_scaling_distance",
    "model.early_stop_eps": "model.renderer.early_stop_eps",
    "model.compact_samples": "model.renderer.compact_samples",
    "model.ops_backend": "model.backend",
    "model.renderer.ops_backend": "model.backend",
    "model.field.encoding.backend": "model.backend",
    "model.field.mlp_backend": "model.backend",
    "data.cuda_graph": "model.cuda_graph",
    "model.sample_budget": "model.step.sample_budget",
    "model.march_budget": "model.step.march_budget",
    "model.n_rays_init": "model.step.n_rays_init",
}


def test_the_aliases_derived_from_the_parameters_are_the_project_s_old_spellings() -> None:
    assert key_aliases() == EXPECTED_ALIASES


def test_old_keys_map_to_the_nodes() -> None:
    assert alias_override("model.near_plane=0.0") == "model.renderer.near_plane=0.0"
    assert alias_override("++model.grid_resolution=32") == "++model.renderer.occupancy.resolution=32"
    assert alias_override("~model.sample_budget") == "~model.step.sample_budget"
    assert alias_override("model.grid_threshold=1") == "model.renderer.occupancy.density_threshold=1"
    # a key is aliased only as a whole: neither a longer key nor a value is touched
    assert alias_override("model.step_size_x=1") == "model.step_size_x=1"
    assert alias_override("data.path=/x/model.near_plane") == "data.path=/x/model.near_plane"
    assert alias_override("model.renderer.near_plane=0") == "model.renderer.near_plane=0"
    # a node's old spelling maps every key under it (Formerly on NGPField's encoding parameter)
    assert alias_override("model.encoding.n_levels=8") == "model.field.encoding.n_levels=8"
    # ... and a key that moved twice is followed to today's (model.field.encoding.backend: model.backend)
    assert alias_override("+model.encoding.backend=torch") == "+model.backend=torch"
    assert normalize_argv(["model.ops_backend=torch"], open_nodes=("model",)) == ["++model.backend=torch"]


def test_every_alias_names_a_key_of_the_config(tmp_path: Path) -> None:
    cfg = compose_train_config([], tmp_path)
    for old, new in key_aliases().items():
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
