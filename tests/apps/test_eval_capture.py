"""eval scores a checkpoint on the capture it was trained on: another capture (other views' names or
sizes) is refused in one line unless ``allow_other_capture=true``; a checkpoint written before the
capture's fingerprint was stored is compared by the view sizes its ray sampler holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from runs import TINY_TRAIN

from nerf_lightning.apps.eval import evaluate
from nerf_lightning.apps.train import train
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.errors import UserError
from nerf_lightning.run.config import compose_app_config, compose_train_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The training's capture (10 views of 24x20), one of other sizes, one with fewer views."""
    root = tmp_path_factory.mktemp("captures")
    shapes = {"own": (10, 24, 20), "larger": (10, 32, 24), "fewer": (9, 24, 20)}
    return {
        name: generate_scene(root / name, n_views=n, width=w, height=h, supersample=1).parent
        for name, (n, w, h) in shapes.items()
    }


@pytest.fixture(scope="module")
def run_dir(captures: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five training steps on ``captures["own"]`` (its last.ckpt is what eval scores); the CPU preset
    halves the images (data.downscale=2)."""
    out = tmp_path_factory.mktemp("run")
    overrides = [*TINY_TRAIN, f"data.path={captures['own']}", "trainer.max_steps=5", "data.max_val_views=2",
                 "data.max_test_views=2", "data.batch_size=128"]  # fmt: skip
    try:
        train(compose_train_config(overrides, out))
    finally:
        GlobalHydra.instance().clear()
    return out


def _eval(tmp_path: Path, *overrides: str) -> dict:
    try:
        return evaluate(compose_app_config("eval", ["save_images=false", *overrides], tmp_path / "eval"))
    finally:
        GlobalHydra.instance().clear()


def test_eval_refuses_a_capture_the_checkpoint_never_saw(run_dir: Path, captures, tmp_path: Path) -> None:
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    own = _eval(tmp_path / "own", f"ckpt={run_dir}")
    assert own["n_views"] == 2 and own["split"] == "val"
    with pytest.raises(UserError) as err:
        _eval(tmp_path / "larger", f"ckpt={run_dir}", f"++data.path={captures['larger']}")
    assert str(err.value) == (
        f"data.path={captures['larger']}: not the capture {ckpt} was trained on (training view "
        "images/0001.png is 16x12 pixels at downscale 2, the checkpoint's 12x10 at downscale 2); score "
        "the checkpoint on its own capture, or pass allow_other_capture=true to score this one anyway"
    )
    assert not (tmp_path / "larger" / "eval" / "metrics.json").exists()
    scored = _eval(tmp_path / "allowed", f"ckpt={run_dir}", f"++data.path={captures['larger']}",
                   "allow_other_capture=true")  # fmt: skip
    assert scored["n_views"] == 2 and (tmp_path / "allowed" / "eval" / "metrics.json").is_file()


def test_a_checkpoint_without_the_fingerprint_is_compared_by_its_view_sizes(
    run_dir: Path, captures, tmp_path: Path
) -> None:
    """A checkpoint of an older version stores no fingerprint: it still scores its own capture, and one
    with another number of training views is refused by the sizes its ray sampler stored."""
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert [name for name, *_ in ckpt["NeRFDataModule"]["capture"]["train"]][:2] == [
        "images/0001.png",
        "images/0002.png",
    ]
    del ckpt["NeRFDataModule"]["capture"]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    assert _eval(tmp_path / "own", f"ckpt={old}")["n_views"] == 2
    with pytest.raises(UserError) as err:
        _eval(tmp_path / "fewer", f"ckpt={old}", f"++data.path={captures['fewer']}")
    assert str(err.value).startswith(
        f"data.path={captures['fewer']}: not the capture {old} was trained on (its 8 training views, this "
        "capture's 7); "
    )


def test_eval_of_a_missing_test_split_suggests_the_split_key(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        _eval(tmp_path, f"ckpt={run_dir}", "split=test")
    assert str(err.value).endswith(": the capture has no test split; use split=val for its held-out views")
    assert str(err.value).startswith("split=test: ")
