"""Bad config values fail before any work starts, with one line naming the key (apps/config_checks.py).

What a key may hold is read from the parameter that receives it (config_schema.py).

Each training case also points ``data.path`` at a capture that does not exist: if the value were
checked only after the data loaded (or not at all), the error would be the capture's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.apps.config_checks import check_config, check_devices
from nerf_lightning.apps.render import RenderOptions
from nerf_lightning.apps.train import TrainOptions, train
from nerf_lightning.errors import UserError
from nerf_lightning.run.config import compose_app_config

NO_DATA = "data.path=/no/such/capture"


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("trainer.max_steps=abc", "trainer.max_steps=abc: expected an integer >= -1 (-1: no limit)"),
        ("trainer.max_steps=2.5", "trainer.max_steps=2.5: expected an integer >= -1"),
        ("data.batch_size=0", "data.batch_size=0: expected an integer >= 1 (rays per step)"),
        ("data.batch_size=-5", "data.batch_size=-5: expected an integer >= 1"),
        ("model.net.renderer.step_size=0", "model.net.renderer.step_size=0: expected a number > 0"),
        ("model.net.renderer.step_size=nan", "model.net.renderer.step_size=nan: expected a number > 0"),
        ("data.max_val_views=0", "data.max_val_views=0: expected an integer >= 1 or null"),
        ("data.aabb_scale=3", "data.aabb_scale=3: expected a power of two <= 128 or null"),
        ("model.optimizer.lr=-0.01", "model.optimizer.lr=-0.01: expected a number > 0"),
        ("accumulate_grad_batches=0", "accumulate_grad_batches=0: expected an integer >= 1"),
        ("overwrite=maybe", "overwrite=maybe: expected true or false"),
        ("resume=sometimes", "resume=sometimes: expected one of never, auto"),
        ("grad_exchange=fp16", "grad_exchange=fp16: expected one of fp32, bf16"),
        (
            "model.net.loss.alpha_weight=sometimes",
            "model.net.loss.alpha_weight=sometimes: expected a number >= 0 or auto "
            "(auto: 0.1 on renders, 0 on photographs)",
        ),
        ("model.net.loss.alpha_weight=-1", "model.net.loss.alpha_weight=-1: expected a number >= 0 or auto"),
        ("devices=4", "devices=4: strategy=single trains on one device; for 4 processes use strategy=ddp"),
        ("devices=two", "devices=two: expected auto, a number of devices >= 1"),
        # numpy's global generator (seeded by Lightning) takes 32 bits
        ("seed=99999999999", "seed=99999999999: expected an integer >= 0 and <= 4294967295"),
        ("seed=4294967296", "seed=4294967296: expected an integer >= 0 and <= 4294967295"),
        # Lightning's CPU accelerator takes a number of processes: the line of devices=0 offers -1 for GPUs
        ("devices=0", "devices=0: expected auto, a number of devices >= 1, -1 (every GPU) or a list of GPU"),
        ("devices=-1", "devices=-1: means every GPU, and this run trains on the CPU (accelerator=cpu); give"),
    ],
)
def test_bad_training_values_fail_before_the_data_loads(compose_cfg, override: str, line: str) -> None:
    cfg = compose_cfg(NO_DATA, override, "logger=none", "accelerator=cpu")
    with pytest.raises(UserError) as err:
        train(cfg)
    assert str(err.value).startswith(line), str(err.value)


def test_gpu_only_device_specs_are_refused_on_the_cpu(compose_cfg) -> None:
    """Lightning's CPU accelerator takes a number of processes (auto: one); -1 and ids are for GPUs."""
    with pytest.raises(UserError, match=r"^devices=\[0, 1\]: lists GPU ids, and this run trains on the CPU"):
        check_devices(compose_cfg("strategy=ddp", "devices=[0,1]", "accelerator=cpu"))
    with pytest.raises(UserError, match=r"^devices=-1: means every GPU, and this run trains on the CPU"):
        check_devices(compose_cfg("strategy=ddp", "devices=-1", "accelerator=cpu"))
    check_devices(compose_cfg("strategy=ddp", "devices='2'", "accelerator=cpu"))  # two CPU processes


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_a_gpu_that_is_not_there_is_refused(compose_cfg) -> None:
    with pytest.raises(UserError, match=r"^accelerator=gpu: no CUDA GPU is visible"):
        check_devices(compose_cfg("accelerator=gpu"))
    check_devices(compose_cfg("strategy=ddp", "devices=4", "accelerator=cpu"))  # 4 CPU processes: fine


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["experiment=cpu"],
        ["experiment=fast"],
        ["experiment=quality"],
        ["experiment=blender", "data.path=/x"],
        ["experiment=fox", "data.path=/x"],
        ["strategy=ddp", "devices=2"],
        ["strategy=fsdp", "devices=2", "accelerator=cpu"],
        ["trainer.max_steps=0"],
        ["model.net.step.sample_budget=null", "data.max_val_views=3", "model.net.renderer.cone_angle=null"],
    ],
)
def test_every_shipped_preset_passes(compose_cfg, overrides: list[str]) -> None:
    cfg = compose_cfg(*overrides)
    check_config(cfg, TrainOptions)


def _app_cfg(app: str, tmp_path: Path, *overrides: str):
    try:
        return compose_app_config(app, ["ckpt=/no/such.ckpt", *overrides], tmp_path)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize(
    ("app", "override", "line"),
    [
        ("render", "width=0", "width=0: expected an integer >= 1 or null"),
        ("render", "height=-16", "height=-16: expected an integer >= 1 or null"),
        ("render", "frames=0", "frames=0: expected an integer >= 1"),
        ("render", "fov=200", "fov=200: expected a number > 0 and < 180 or null"),
        ("render", "background=[1,0]", "background=[1, 0]: expected [r, g, b] with values in [0, 1]"),
        ("export", "resolution=0", "resolution=0: expected an integer >= 1"),
        ("export", "what=cube", "what=cube: expected one of mesh, pointcloud"),
        ("export", "bounds=[0,0,0,1,1,0]", "bounds=[0, 0, 0, 1, 1, 0]: expected [xmin, ymin, zmin, xmax"),
        ("eval", "+data.max_val_views=0", "data.max_val_views=0: expected an integer >= 1 or null"),
        ("eval", "split=holdout", "split=holdout: expected one of auto, val, test, train"),
    ],
)
def test_bad_app_values_fail_before_the_checkpoint_is_read(
    tmp_path: Path, app: str, override: str, line: str
) -> None:
    from nerf_lightning.apps.eval import evaluate
    from nerf_lightning.apps.export import export
    from nerf_lightning.apps.render import render_video

    task = {"eval": evaluate, "render": render_video, "export": export}[app]
    with pytest.raises(UserError) as err:  # the checkpoint does not exist: its error would come first
        task(_app_cfg(app, tmp_path, override))
    assert str(err.value).startswith(line), str(err.value)


def test_the_app_defaults_pass(tmp_path: Path) -> None:
    check_config(_app_cfg("render", tmp_path), RenderOptions)
    with pytest.raises(UserError, match="no such file"):  # the defaults go on to the checkpoint
        from nerf_lightning.apps.render import render_video

        render_video(_app_cfg("render", tmp_path))


def test_a_bad_aabb_scale_is_the_capture_file_s_not_the_model_config(
    tiny_scene: Path, compose_cfg, tmp_path: Path
) -> None:
    import json
    import shutil

    capture = tmp_path / "capture"
    shutil.copytree(tiny_scene, capture)
    doc = json.loads((capture / "transforms.json").read_text())
    doc["aabb_scale"] = 1000
    (capture / "transforms.json").write_text(json.dumps(doc))
    with pytest.raises(UserError) as err:
        train(compose_cfg(f"data.path={capture}", "logger=none", "accelerator=cpu"))
    assert str(err.value).startswith(f"{capture / 'transforms.json'}: key 'aabb_scale' is 1000: expected")
    assert "config `model`" not in str(err.value)
