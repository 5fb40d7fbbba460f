"""Splits that make sense: train-only Blender folders hold out frames, empty validation is refused,
a test split is the final evaluation (DataModule API and ``train()``'s ``metrics.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from nerf_lightning.apps.train import train
from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.formats import CaptureError, load_capture

from .conftest import _frames, orbit_poses, write_image


def _blender(root: Path, splits: dict[str, int]) -> Path:
    """A Blender folder with the given split sizes (10x10 RGBA, extension-less file paths)."""
    for split, n in splits.items():
        names = [f"./{split}/r_{i}" for i in range(n)]
        for i, nm in enumerate(names):
            write_image(root / f"{nm}.png", 10, 10, seed=100 * len(split) + i, channels=4)
        data = {"camera_angle_x": 0.69, "frames": _frames(orbit_poses(n, radius=4.0), names)}
        (root / f"transforms_{split}.json").write_text(json.dumps(data))
    return root


def _names(frames) -> list[str]:
    return [f.image_path.name for f in frames]


def test_blender_train_only_holds_out_every_nth_frame(tmp_path: Path) -> None:
    root = _blender(tmp_path / "lego", {"train": 7})
    cap = load_capture(root, test_every=3)
    assert _names(cap.val) == ["r_0.png", "r_3.png", "r_6.png"]
    assert _names(cap.train) == ["r_1.png", "r_2.png", "r_4.png", "r_5.png"]
    assert cap.test == []
    # a split file decides: with a test split nothing is taken from train
    _blender(root, {"test": 2})
    cap = load_capture(root, test_every=3)
    assert (len(cap.train), len(cap.val), len(cap.test)) == (7, 0, 2)


def test_empty_validation_refuses_to_start(make_ngp, tmp_path: Path) -> None:
    root = make_ngp(n=5)
    dm = NeRFDataModule(path=str(root), test_every=0, cache_dir=str(tmp_path / "c"))
    with pytest.raises(CaptureError, match=r"no held-out views.*data\.test_every=0.*set data\.test_every=N"):
        dm.setup("fit")
    blender = _blender(tmp_path / "b", {"train": 3, "val": 0})
    with pytest.raises(CaptureError, match=r"no held-out views.*transforms_val\.json"):
        NeRFDataModule(path=str(blender), cache_dir=str(tmp_path / "c")).setup("fit")


def test_test_split_is_the_final_evaluation(tmp_path: Path) -> None:
    root = _blender(tmp_path / "lego", {"train": 4, "val": 2, "test": 3})
    dm = NeRFDataModule(path=str(root), cache_dir=str(tmp_path / "c"))
    dm.setup("fit")
    assert dm.eval_split == "test"
    assert _names(dm.val_set.frames) == ["r_0.png", "r_1.png"] and len(dm.test_set.frames) == 3
    assert len(dm.val_dataloader()) == 2 and len(dm.test_dataloader()) == 3
    dm.ensure_device(torch.device("cpu"))
    b = dm.test_batch(2)
    # the test batch holds test image r_2 (alpha-composited over white), not a validation image
    rgba = torch.from_numpy(np.array(Image.open(root / "test/r_2.png"))).reshape(-1, 4).float() / 255
    expected = rgba[:, :3] * rgba[:, 3:] + (1 - rgba[:, 3:])
    torch.testing.assert_close(b["rgb"], expected)
    torch.testing.assert_close(b["rays_o"][0], dm.test_set.poses[2, :, 3])


def test_no_test_split_evaluates_all_held_out_views(make_ngp, tmp_path: Path) -> None:
    root = make_ngp(n=9)
    dm = NeRFDataModule(path=str(root), test_every=3, cache_dir=str(tmp_path / "c"))
    dm.setup("fit")
    assert dm.eval_split == "val" and dm.test_set is dm.val_set  # one copy, one evaluation pass
    thinned = NeRFDataModule(path=str(root), test_every=3, max_val_views=1, cache_dir=str(tmp_path / "c"))
    thinned.setup("fit")
    assert len(thinned.val_set.frames) == 1 and len(thinned.test_set.frames) == 3
    assert thinned.eval_split == "val"


TINY = [
    "model.net.renderer.occupancy.resolution=8",
    "model.net.field.encoding.n_levels=2",
    "model.net.field.encoding.log2_hashmap_size=10",
    "model.net.field.encoding.max_resolution=32",
    "model.net.renderer.step_size=0.05",
    "model.net.renderer.max_samples_per_ray=32",
    "callbacks=none",
    "accelerator=cpu",
    "logger=none",
    "trainer.max_steps=0",
]


def test_train_reports_test_split_and_per_view_numbers(tmp_path: Path, compose_cfg) -> None:
    root = _blender(tmp_path / "lego", {"train": 3, "val": 2, "test": 3})
    cfg = compose_cfg(f"data.path={root}", f"data.cache_dir={tmp_path / 'c'}", *TINY)
    metrics = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert written["eval/split"] == "test"
    assert written["val/per_view"]["image"] == ["r_0.png", "r_1.png"]
    per_test = written["test/per_view"]
    assert per_test["image"] == ["r_0.png", "r_1.png", "r_2.png"] and per_test["view"] == [0, 1, 2]
    # the reported PSNR is the mean of the per-image PSNRs
    assert written["test/psnr"] == pytest.approx(sum(per_test["psnr"]) / 3, abs=1e-4)
    assert written["eval/psnr"] == pytest.approx(written["test/psnr"])
    assert written["val/psnr"] == pytest.approx(sum(written["val/per_view"]["psnr"]) / 2, abs=1e-4)
    assert metrics["eval/split"] == "test"


def test_max_test_views_thins_the_final_evaluation_and_names_its_views(
    tmp_path: Path, compose_cfg, caplog: pytest.LogCaptureFixture
) -> None:
    root = _blender(tmp_path / "lego", {"train": 3, "val": 2, "test": 5})
    dm = NeRFDataModule(path=str(root), max_test_views=3, cache_dir=str(tmp_path / "c"))
    dm.setup("fit")
    assert _names(dm.test_set.frames) == ["r_0.png", "r_1.png", "r_3.png"]  # 5 / 3: every 1.67th view
    assert _names(dm.val_set.frames) == ["r_0.png", "r_1.png"]  # validation keeps its own limit
    cfg = compose_cfg(f"data.path={root}", f"data.cache_dir={tmp_path / 'c'}", "data.max_test_views=2", *TINY)
    with caplog.at_level("INFO", logger="nerf_lightning.models.metrics"):
        metrics = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert written["test/per_view"]["image"] == ["r_0.png", "r_2.png"]  # 5 / 2: views 0 and 2.5 -> 2
    assert written["eval/views"] == ["r_0.png", "r_2.png"] == metrics["eval/views"]
    assert (written["eval/n_views"], written["eval/n_split_views"]) == (2, 5)
    assert written["test/psnr"] == pytest.approx(sum(written["test/per_view"]["psnr"]) / 2, abs=1e-4)
    assert "final evaluation: 2 of 5 test views (data.max_test_views=2; null: all): r_0.png, r_2.png" in (
        caplog.text
    )


def test_the_cpu_preset_scores_a_handful_of_test_views_and_a_gpu_all(compose_cfg) -> None:
    assert compose_cfg("experiment=cpu").data.max_test_views == 8
    assert compose_cfg().data.max_test_views is None
    assert compose_cfg("experiment=blender").data.max_test_views is None


@pytest.mark.parametrize(("n_views", "world"), [(13, 2), (7, 3), (2, 3), (4, 4)])
def test_held_out_views_shard_over_ranks_in_equal_counts(tmp_path: Path, n_views: int, world: int) -> None:
    """Every view on some rank, the same number of views on every rank (an FSDP validation step is a
    collective), and nothing beyond the repeats needed for that."""
    root = _blender(tmp_path / "lego", {"train": 2, "val": n_views})
    dm = NeRFDataModule(path=str(root), cache_dir=str(tmp_path / "c"))
    dm.setup("fit")

    class _Trainer:  # what _view_loader reads of a trainer
        def __init__(self, rank: int) -> None:
            self.global_rank, self.world_size = rank, world

    per_rank = []
    for rank in range(world):
        dm.trainer = _Trainer(rank)  # type: ignore[assignment]
        per_rank.append([int(v) for v in dm.val_dataloader()])
    assert {len(views) for views in per_rank} == {-(-n_views // world)}
    assert sorted({v for views in per_rank for v in views}) == list(range(n_views))
    for rank, views in enumerate(per_rank):
        assert views[: len(range(rank, n_views, world))] == list(range(rank, n_views, world))
