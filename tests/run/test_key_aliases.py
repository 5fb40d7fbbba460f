"""The flat model keys of earlier configs still work, on the command line and in composed configs.

The old spellings are read from ``Formerly`` on the parameters the config reaches (run/config_tree.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nerf_lightning.apps.entry import normalize_argv
from nerf_lightning.run.config import alias_override, compose_train_config
from nerf_lightning.run.config_tree import key_aliases
from nerf_lightning.run.model_node import instantiate_model

#: every old spelling the project has accepted since the model's nodes were introduced, written out
EXPECTED_ALIASES = {
    "model.field.": "model.net.field.",
    "model.encoding.": "model.net.field.encoding.",
    "model.renderer.": "model.net.renderer.",
    "model.grid_resolution": "model.net.renderer.occupancy.resolution",
    "model.grid_update_every": "model.net.renderer.occupancy.update_every",
    "model.grid_warmup_steps": "model.net.renderer.occupancy.warmup_steps",
    "model.grid_decay": "model.net.renderer.occupancy.decay",
    "model.grid_threshold": "model.net.renderer.occupancy.density_threshold",
    "model.step_size": "model.net.renderer.step_size",
    "model.cone_angle": "model.net.renderer.cone_angle",
    "model.large_scene_cone_angle": "model.net.renderer.large_scene_cone_angle",
    "model.max_samples_per_ray": "model.net.renderer.max_samples_per_ray",
    "model.near_plane": "model.net.renderer.near_plane",
    "model.gradient_scaling_distance": "model.net.renderer.gradient_scaling_distance",
    "model.early_stop_eps": "model.net.renderer.early_stop_eps",
    "model.compact_samples": "model.net.renderer.compact_samples",
    "model.ops_backend": "model.net.backend",
    "model.renderer.ops_backend": "model.net.backend",
    "model.field.encoding.backend": "model.net.backend",
    "model.field.mlp_backend": "model.net.backend",
    "model.net.renderer.ops_backend": "model.net.backend",
    "model.net.field.encoding.backend": "model.net.backend",
    "model.net.field.mlp_backend": "model.net.backend",
    "model.backend": "model.net.backend",
    "data.cuda_graph": "model.cuda_graph",
    "model.step.": "model.net.step.",
    "model.sample_budget": "model.net.step.sample_budget",
    "model.march_budget": "model.net.step.march_budget",
    "model.n_rays_init": "model.net.step.n_rays_init",
    "model.jitter": "model.net.step.jitter",
    "model.loss": "model.net.loss.kind",
    "model.huber_delta": "model.net.loss.huber_delta",
    "model.distortion_weight": "model.net.loss.distortion_weight",
    "model.alpha_weight": "model.net.loss.alpha_weight",
    "model.camera_opt.": "model.net.camera_opt.",
    "model.appearance.": "model.net.appearance.",
}


def test_the_aliases_derived_from_the_parameters_are_the_project_s_old_spellings() -> None:
    assert key_aliases() == EXPECTED_ALIASES


def test_old_keys_map_to_the_nodes() -> None:
    assert alias_override("model.near_plane=0.0") == "model.net.renderer.near_plane=0.0"
    assert alias_override("++model.grid_resolution=32") == "++model.net.renderer.occupancy.resolution=32"
    assert alias_override("~model.sample_budget") == "~model.net.step.sample_budget"
    assert alias_override("model.grid_threshold=1") == "model.net.renderer.occupancy.density_threshold=1"
    # a key is aliased only as a whole: neither a longer key nor a value is touched
    assert alias_override("model.step_size_x=1") == "model.step_size_x=1"
    assert alias_override("data.path=/x/model.near_plane") == "data.path=/x/model.near_plane"
    assert alias_override("model.net.renderer.near_plane=0") == "model.net.renderer.near_plane=0"
    # the nodes and loss keys before model.net (issue 65)
    assert alias_override("model.renderer.near_plane=0") == "model.net.renderer.near_plane=0"
    assert alias_override("model.huber_delta=0.2") == "model.net.loss.huber_delta=0.2"
    assert alias_override("model.loss=mse") == "model.net.loss.kind=mse"
    # a node's old spelling maps every key under it (Formerly on NGPField's encoding parameter)
    assert alias_override("model.encoding.n_levels=8") == "model.net.field.encoding.n_levels=8"
    # ... and a key that moved three times is followed to today's (model.encoding.backend ->
    # model.net.field.encoding.backend -> model.net.backend)
    assert alias_override("+model.encoding.backend=torch") == "+model.net.backend=torch"
    assert normalize_argv(["model.ops_backend=torch"], open_nodes=("model",)) == ["++model.net.backend=torch"]


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
    model = cfg.model.net
    assert model.renderer.occupancy.resolution == 32 and model.renderer.near_plane == 0.0
    assert model.renderer.gradient_scaling_distance is None and model.step.sample_budget is None
    module = instantiate_model(cfg.model, {"aabb_scale": 1})
    assert module.occupancy.resolution == 32 and module.renderer.step_size == pytest.approx(0.03)
    assert module.renderer.near_plane == 0.0 and module.renderer.gradient_scaling_distance is None
    assert not module.train_step_fn.budgeted  # no sample budget: data.batch_size rays per step


def test_the_default_model_is_built_from_its_nodes(tmp_path: Path) -> None:
    overrides = ["model.net.backend=torch"]
    cfg = compose_train_config(overrides, tmp_path)
    module = instantiate_model(cfg.model, {"aabb_scale": 4})
    assert module.occupancy.aabb_scale == 4 and module.occupancy.resolution == 128
    assert module.occupancy.update_every == 16 and module.occupancy.warmup_steps == 256
    assert module.renderer.cone_angle == pytest.approx(1 / 256)  # null: instant-ngp's for aabb_scale > 1
    step = module.train_step_fn
    assert step.sample_budget == 1 << 18 and step.march_budget == 1 << 20 and int(step.n_active) == 4096
