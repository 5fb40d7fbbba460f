"""A constructor checks its arguments against its own annotations (``config_keys.check_arguments``), and
names a refused one by the config key a user sets, read from the YAML; rules between two keys are the
constructors' own, one line each."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import pytest
import torch

from nerf_lightning.config_keys import check_arguments, config_key
from nerf_lightning.config_schema import Range
from nerf_lightning.data.sampler import LossWeightedRaySampler
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.encoding import HashEncoding, SHEncoding
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.models.train_step import TrainStep
from nerf_lightning.run.checkpoint_callbacks import LastCheckpoint
from nerf_lightning.viewer.callback import ViewerCallback
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer, build_renderer
from tests.nerf_modules import nerf_module


def _module(**kwargs: Any) -> NeRFModule:
    return nerf_module(field=functools.partial(NGPField), optimizer=torch.optim.Adam, **kwargs)


@pytest.mark.parametrize(
    ("build", "line"),
    [
        (lambda: Renderer(OccupancyGrid(resolution=8), near_plane=-1.0),
         "model.net.renderer.near_plane=-1.0: expected a number >= 0"),
        (lambda: build_renderer(cone_angle=-0.5),
         "model.net.renderer.cone_angle=-0.5: expected a number >= 0 or null"),
        (lambda: HashEncoding(log2_hashmap_size=31),
         "model.net.field.encoding.log2_hashmap_size=31: expected an integer >= 1 and <= 30 (log2 of the "
         "entries "
         "per level)"),
        (lambda: HashEncoding(backend="jax"),
         "model.net.backend=jax: expected one of auto, cuda, tcnn, torch"),
        (lambda: NGPField(sh_degree=5),
         "model.net.field.sh_degree=5: expected an integer >= 1 and <= 4 (spherical-harmonics bands)"),
        (lambda: _module(loss="l1"), "model.net.loss.kind=l1: expected one of huber, mse"),
        (lambda: _module(alpha_weight=-1.0),
         "model.net.loss.alpha_weight=-1.0: expected a number >= 0 or auto (auto: 0.1 on renders, 0 on "
         "photographs)"),
        (lambda: CameraOptimizer(2, gauge="rigid"),
         "model.net.camera_opt.gauge=rigid: expected one of similarity, none"),
        (lambda: LossWeightedRaySampler([4], [4], ema_decay=1.0),
         "data.samplers.loss_weighted.ema_decay=1.0: expected a number >= 0 and < 1"),
        (lambda: LastCheckpoint(".", check_every_n_steps=0),
         "callbacks.last_checkpoint.check_every_n_steps=0: expected an integer >= 1"),
        # a value interpolated from a key of its own (callbacks.viewer.budget: ${viewer.budget})
        (lambda: ViewerCallback(budget=0.0), "viewer.budget=0.0: expected a number > 0 (render seconds per "
         "training second)"),
        # an argument the code passes is named by its constructor, not by a config key
        (lambda: SHEncoding(0),
         "SHEncoding.degree=0: expected an integer >= 1 and <= 4 (spherical-harmonics bands)"),
        (lambda: OccupancyGrid(aabb_scale=3), "OccupancyGrid.aabb_scale=3: expected a power of two <= 128"),
    ],
)  # fmt: skip
def test_a_refused_argument_is_named_by_its_key(build: Any, line: str) -> None:
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value) == line


@pytest.mark.parametrize(
    ("build", "line"),
    [
        (lambda: HashEncoding(base_resolution=64, max_resolution=32),
         "model.net.field.encoding.max_resolution=32: expected >= base_resolution (64)"),
        (lambda: TrainStep(None, None, sample_budget=1024, march_budget=512),  # type: ignore[arg-type]
         "model.net.step.march_budget=512: expected >= model.net.step.sample_budget (1024)"),
    ],
)  # fmt: skip
def test_a_rule_between_two_keys_is_one_line(build: Any, line: str) -> None:
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value) == line


def test_values_on_the_bounds_pass() -> None:
    HashEncoding(n_levels=1, log2_hashmap_size=1, base_resolution=4, max_resolution=4, backend="torch")
    assert NGPField(sh_degree=1).direction_encoding.n_output_dims == 1
    assert OccupancyGrid(aabb_scale=128, resolution=2).n_cascades == 8


def test_the_keys_follow_the_yaml() -> None:
    assert config_key(HashEncoding, "n_levels") == "model.net.field.encoding.n_levels"  # KeysOf(HashEncoding)
    assert config_key(Renderer, "step_size") == "model.net.renderer.step_size"  # **kwargs: KeysOf(Renderer)
    assert config_key(ViewerCallback, "port") == "viewer.port"
    assert config_key(ViewerCallback, "export_dir") == "paths.output_dir"
    assert config_key(LossWeightedRaySampler, "alpha") == "data.samplers.loss_weighted.alpha"


def _lamp(watts: Annotated[int, Range(low=1)] = 60) -> None:
    check_arguments(_lamp, locals())


def test_a_constructor_no_yaml_builds_is_named_by_itself() -> None:
    with pytest.raises(ValueError, match=r"^_lamp.watts=0: expected an integer >= 1$"):
        _lamp(0)
