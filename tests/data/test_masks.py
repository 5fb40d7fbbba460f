"""Masks of what moved: read in every capture format, downscaled, cached, never a training ray, left out of
the held-out PSNR.

Expected values come from the masks the tests draw (which pixels they mark), never from the code read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from runs import user_error_line

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.masks import KeptPixels, decode_mask, downscale_keep, load_masks
from nerf_lightning.data.sampler import LossWeightedRaySampler, UniformRaySampler
from nerf_lightning.data.shards import ShardDraw
from nerf_lightning.models.metrics import ViewMetrics


def _png(path: Path, arr: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr.astype(np.uint8)).save(path)
    return path


def _occluder(w: int, h: int, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """bool [h, w]: True inside the rectangle [x0, x1) x [y0, y1)."""
    m = np.zeros((h, w), dtype=bool)
    m[y0:y1, x0:x1] = True
    return m


def test_the_two_conventions_decode_to_the_same_keep_mask(tmp_path: Path) -> None:
    moved = _occluder(8, 6, 2, 1, 5, 4)  # 3 x 3 = 9 pixels of 48
    dynamic = _png(tmp_path / "dynamic_mask_a.png", np.where(moved, 255, 0))  # instant-ngp: nonzero = ignore
    keep_file = _png(tmp_path / "a.png", np.where(moved, 0, 255))  # nerfstudio: 0 = ignore
    rgb = np.zeros((6, 8, 3), dtype=np.uint8)
    rgb[moved, 1] = 7  # any non-zero channel marks the pixel in instant-ngp's RGB masks
    dynamic_rgb = _png(tmp_path / "dynamic_mask_b.png", rgb)
    for path, kind in ((dynamic, "dynamic"), (keep_file, "keep"), (dynamic_rgb, "dynamic")):
        keep = decode_mask(path.read_bytes(), kind, path)
        assert keep.shape == (6, 8)
        assert np.array_equal(keep, ~moved), path.name
        assert int(keep.sum()) == 48 - 9


def test_downscaling_ignores_a_block_with_any_ignored_pixel() -> None:
    keep = np.ones((5, 6), dtype=bool)  # cropped to 4 x 6 at factor 2, as the image is
    keep[0, 0] = False  # block (0, 0)
    keep[3, 5] = False  # block (1, 2)
    keep[4, 0] = False  # the cropped row: no block
    small = downscale_keep(keep, 2)
    assert small.tolist() == [[False, True, True], [True, True, False]]


def _masked_ngp(make_ngp, tmp_path: Path, moved: dict[int, np.ndarray]) -> Path:
    """The instant-ngp fixture capture (16 x 12, frames images/0000.png ...) with instant-ngp masks."""
    root = make_ngp(n=7)
    for i, m in moved.items():
        _png(root / "images" / f"dynamic_mask_{i:04d}.png", np.where(m, 255, 0))
    return root


def test_every_format_reads_its_masks(
    make_ngp, make_nerfstudio, blender_capture: Path, tmp_path: Path
) -> None:
    moved = _occluder(16, 12, 0, 0, 4, 3)
    root = _masked_ngp(make_ngp, tmp_path, {1: moved, 2: moved})
    cap = load_capture(root, test_every=0)
    masked = {
        f.image_path.name: (f.mask_path.name, f.mask_kind) for f in cap.train if f.mask_path is not None
    }
    assert masked == {
        "0001.png": ("dynamic_mask_0001.png", "dynamic"),
        "0002.png": ("dynamic_mask_0002.png", "dynamic"),
    }

    ns = make_nerfstudio(n=4)
    _png(ns / "masks" / "frame_00002.png", np.where(_occluder(16, 12, 0, 0, 2, 2), 0, 255))
    data = json.loads((ns / "transforms.json").read_text())
    data["frames"][2]["mask_path"] = "masks/frame_00002.png"
    (ns / "transforms.json").write_text(json.dumps(data))
    frames = load_capture(ns, test_every=0).train
    assert [(f.mask_path.name if f.mask_path else None, f.mask_kind) for f in frames][2] == (
        "frame_00002.png",
        "keep",
    )
    assert sum(f.mask_path is not None for f in frames) == 1

    _png(blender_capture / "train" / "dynamic_mask_r_1.png", np.where(_occluder(10, 10, 0, 0, 5, 5), 255, 0))
    lego = load_capture(blender_capture)
    assert [f.mask_path.name for f in lego.train if f.mask_path] == ["dynamic_mask_r_1.png"]


def test_a_mask_of_another_size_or_a_listed_mask_that_is_missing_is_one_line(make_ngp, capsys) -> None:
    root = make_ngp(n=4, name="odd")
    _png(root / "images" / "dynamic_mask_0001.png", np.zeros((6, 8)))
    line = user_error_line(capsys, lambda: load_capture(root))
    assert line.endswith(
        "dynamic_mask_0001.png: mask is 8x6 but its image 0001.png is 16x12; a mask must have its "
        "image's size"
    )

    root = make_ngp(n=4, name="listed", frame_extra={2: {"mask_path": "masks/0002.png"}})
    line = user_error_line(capsys, lambda: load_capture(root))
    assert "frame 2 (images/0002.png): 'mask_path' masks/0002.png does not exist" in line


def test_masks_are_downscaled_and_cached_by_their_bytes(make_ngp, tmp_path: Path) -> None:
    moved = _occluder(16, 12, 3, 0, 4, 1)  # one pixel: column 3, row 0 -> block (0, 1) at factor 2
    root = _masked_ngp(make_ngp, tmp_path, {0: moved})
    frames = load_capture(root, downscale=2, test_every=0).train
    cache = tmp_path / "cache"
    masks = load_masks(frames, downscale=2, cache_dir=cache)
    assert masks is not None and masks[1] is None
    expected = np.ones((6, 8), dtype=bool)
    expected[0, 1] = False
    assert np.array_equal(masks[0], expected)
    entries = sorted(cache.glob("mask-*"))
    assert len(entries) == 1
    np.save(entries[0], np.zeros((6, 8), dtype=bool))  # a planted entry is what a hit returns
    assert not load_masks(frames, downscale=2, cache_dir=cache)[0].any()
    _png(frames[0].mask_path, np.where(_occluder(16, 12, 0, 0, 2, 2), 255, 0))  # an edited mask misses
    again = load_masks(frames, downscale=2, cache_dir=cache)[0]
    assert int((~again).sum()) == 1 and not again[0, 0]


def _table(h: int = 6, w: int = 8) -> tuple[KeptPixels, np.ndarray]:
    """Three views of 8 x 6: view 0 with a 3 x 3 occluder, view 1 unmasked, view 2 wholly masked."""
    moved = _occluder(w, h, 2, 1, 5, 4)
    masks = [~moved, None, np.zeros((h, w), dtype=bool)]
    return KeptPixels.of_masks(masks, [w] * 3, [h] * 3), moved


def test_the_samplers_never_draw_a_masked_pixel_and_draw_the_kept_ones_uniformly() -> None:
    kept, moved = _table()
    widths, heights = torch.full((3,), 8), torch.full((3,), 6)
    torch.manual_seed(0)
    uniform = UniformRaySampler(widths, heights, kept=kept)
    # views in proportion to their kept pixels: 39 and 48 of 87, the wholly masked view never
    assert torch.allclose(uniform.view_probs, torch.tensor([39 / 87, 48 / 87, 0.0], dtype=torch.float64))
    v, px, py = uniform.sample(200_000)
    assert int((v == 2).sum()) == 0
    in_view0 = v == 0
    hit = torch.from_numpy(moved)[py[in_view0], px[in_view0]]
    assert int(hit.sum()) == 0
    counts = torch.bincount((py[in_view0] * 8 + px[in_view0]), minlength=48).float()
    kept_counts = counts[torch.from_numpy(~moved.reshape(-1))]
    assert kept_counts.min() > 0.9 * kept_counts.mean() and kept_counts.max() < 1.1 * kept_counts.mean()
    assert int(torch.bincount(py[v == 1] * 8 + px[v == 1], minlength=48).min()) > 0  # all of view 1

    weighted = LossWeightedRaySampler(
        widths,
        heights,
        warmup_steps=0,
        update_every=1,
        uniform_floor=0.0,
        scale_by_pixel_count=False,
        kept=kept,
    )
    for step in range(3):  # view 2 is never drawn (unseen: its EMA is the mean), yet has no pixel to give
        zeros = torch.zeros(2, dtype=torch.long)
        weighted.update(torch.tensor([0, 1]), zeros, zeros, torch.tensor([1.0, 1.0]))
        weighted.step(step)
    assert float(weighted.view_probs[2]) == 0.0
    v, px, py = weighted.sample(50_000)
    assert int((v == 2).sum()) == 0 and int(torch.from_numpy(moved)[py[v == 0], px[v == 0]].sum()) == 0


def test_a_shard_and_the_host_draw_only_kept_pixels() -> None:
    kept, moved = _table()
    widths, heights = torch.full((3,), 8), torch.full((3,), 6)
    sampler = UniformRaySampler(widths, heights, kept=kept)
    shard = ShardDraw(torch.tensor([0, 2]), widths[:2], heights[:2], world=2, kept=kept)
    views, local, px, py = shard.sample(sampler.view_probs, 20_000)
    assert set(views.tolist()) == {0}  # view 2 of the shard is wholly masked
    assert int(torch.from_numpy(moved)[py, px].sum()) == 0
    assert abs(float(shard.weight) - 2 * 39 / 87) < 1e-6  # float32

    from nerf_lightning.data.host_pixels import HostPixels
    from nerf_lightning.data.shards import draw_pixels

    pixels = torch.zeros(3 * 48, 3, dtype=torch.uint8)
    host = HostPixels(pixels, torch.tensor([0, 48, 96]), widths, heights, torch.device("cpu"))
    view_ids, _, px, py, _ = draw_pixels(sampler, None, host, 20_000)
    assert int((view_ids == 2).sum()) == 0
    assert int(torch.from_numpy(moved)[py[view_ids == 0], px[view_ids == 0]].sum()) == 0


def test_the_datamodule_trains_on_kept_pixels_and_scores_held_out_views_on_them(
    make_ngp, tmp_path: Path
) -> None:
    moved = _occluder(16, 12, 4, 2, 12, 10)  # 8 x 8 of 16 x 12
    root = _masked_ngp(make_ngp, tmp_path, {i: moved for i in range(7)})
    dm = NeRFDataModule(path=str(root), test_every=3, batch_size=4096, cache_dir=str(tmp_path / "c"))
    dm.setup()
    dm.ensure_device(torch.device("cpu"))
    assert dm.sampler is not None and dm.sampler.kept is not None
    batch = dm.train_batch(4096)
    assert int(torch.from_numpy(moved)[batch.py, batch.px].sum()) == 0
    val = dm.val_batch(0)
    assert torch.equal(val["keep"], torch.from_numpy(~moved.reshape(-1)))

    plain = NeRFDataModule(path=str(make_ngp(n=7, name="plain")), test_every=3, cache_dir=str(tmp_path / "c"))
    plain.setup()
    assert plain.sampler is not None and plain.sampler.kept is None  # no table, no per-ray work
    assert "keep" not in plain.val_batch(0)


def test_the_held_out_psnr_leaves_masked_pixels_out() -> None:
    target = torch.full((6, 8, 3), 0.5)
    pred = target.clone()
    moved = torch.from_numpy(_occluder(8, 6, 2, 1, 5, 4))
    pred[moved] = 1.0  # the occluder: 0.5 off
    pred[0, 0] = 0.6  # one kept pixel 0.1 off in every channel
    metrics = ViewMetrics(lpips=False)
    metrics.update(pred, target, 0, keep=~moved)
    metrics.update(pred, target, 1)
    result = metrics.compute()
    per_view = result["per_view"]["psnr"]
    # kept: 39 pixels, one of them with squared error 0.01 -> MSE 0.01 / 39
    assert float(per_view[0]) == pytest.approx(-10 * math.log10(0.01 / 39), abs=1e-4)
    # all 48: nine more with 0.25
    assert float(per_view[1]) == pytest.approx(-10 * math.log10((0.01 + 9 * 0.25) / 48), abs=1e-4)
