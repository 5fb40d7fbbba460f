"""Image decoding, integer downscaling, packing and the content-addressed cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from nerf_lightning.data import images as images_mod
from nerf_lightning.data.formats import CaptureError, load_capture
from nerf_lightning.data.images import default_cache_dir, downscale_image, load_images
from nerf_lightning.data.types import Frame, Intrinsics

from .conftest import write_image


def _frames(paths: list[Path]) -> list[Frame]:
    return [Frame(p, np.eye(4), Intrinsics(10.0, 10.0, 5.0, 5.0, 10, 10)) for p in paths]


def test_pack_rgb_views_exactly(tmp_path):
    a = write_image(tmp_path / "a.png", 5, 3, seed=0)
    b = write_image(tmp_path / "b.png", 4, 6, seed=1)
    s = load_images(_frames([tmp_path / "a.png", tmp_path / "b.png"]), cache_dir=tmp_path / "cache")
    assert s.channels == 3 and s.pixels.dtype == torch.uint8 and s.pixels.shape == (15 + 24, 3)
    assert s.offsets.tolist() == [0, 15] and s.widths.tolist() == [5, 4] and s.heights.tolist() == [3, 6]
    assert s.offsets.dtype == torch.int64 and s.num_views == 2
    np.testing.assert_array_equal(s.view(0).numpy(), a)
    np.testing.assert_array_equal(s.view(1).numpy(), b)
    # Row-major: pixel (i=2, j=4) of view 1.
    np.testing.assert_array_equal(s.pixels[15 + 4 * 4 + 2].numpy(), b[4, 2])


def test_any_alpha_makes_all_rgba(tmp_path):
    rgb = write_image(tmp_path / "rgb.png", 4, 4, seed=0)
    rgba = write_image(tmp_path / "rgba.png", 4, 4, seed=1, channels=4)
    s = load_images(_frames([tmp_path / "rgb.png", tmp_path / "rgba.png"]), cache_dir=tmp_path / "c")
    assert s.channels == 4
    np.testing.assert_array_equal(s.view(0)[..., :3].numpy(), rgb)
    assert (s.view(0)[..., 3] == 255).all()
    np.testing.assert_array_equal(s.view(1).numpy(), rgba)


def test_downscale_block_mean_and_crop():
    img = np.zeros((5, 7, 1), dtype=np.uint8)
    img[0:2, 0:2, 0] = [[0, 1], [2, 4]]  # mean 1.75 -> 2
    img[0:2, 2:4, 0] = [[10, 10], [11, 10]]  # mean 10.25 -> 10
    img[2:4, 4:6, 0] = [[255, 255], [255, 254]]  # mean 254.75 -> 255
    img[4, :, 0] = 200  # cropped row
    img[:, 6, 0] = 200  # cropped column
    out = downscale_image(img, 2)
    assert out.shape == (2, 3, 1) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], [[2, 10, 0], [0, 0, 255]])
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, size=(24, 18, 3), dtype=np.uint8)
    # Width 18 crops to 16; round half up like (sum + 32) // 64.
    ref = np.floor(big[:, :16].reshape(3, 8, 2, 8, 3).astype(np.float64).mean(axis=(1, 3)) + 0.5)
    out8 = downscale_image(big, 8)
    assert out8.shape == (3, 2, 3)
    np.testing.assert_array_equal(out8, ref.astype(np.uint8))


def test_downscale_rgba_composites_like_its_block():
    # a 2x2 block: one opaque red pixel, three transparent black ones (an object edge)
    img = np.zeros((2, 2, 4), dtype=np.uint8)
    img[0, 0] = [255, 0, 0, 255]
    out = downscale_image(img, 2)[0, 0].astype(np.float64)
    assert out[3] == 64  # mean alpha 0.25
    np.testing.assert_array_equal(out[:3], [255, 0, 0])  # the colour of the only visible pixel
    # over any background the downscaled pixel equals the mean of the composited block
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, size=(8, 8, 4), dtype=np.uint8)
    small = downscale_image(big, 4).astype(np.float64) / 255
    for bg in (np.zeros(3), np.ones(3), np.array([0.2, 0.7, 0.4])):
        a = big[..., 3:] / 255
        composited = (big[..., :3] / 255 * a + bg * (1 - a)).reshape(2, 4, 2, 4, 3).mean(axis=(1, 3))
        got = small[..., :3] * small[..., 3:] + bg * (1 - small[..., 3:])
        np.testing.assert_allclose(got, composited, atol=2.5 / 255)


def test_downscaled_sizes_match_intrinsics(make_ngp, tmp_path):
    root = make_ngp(n=3, size=(17, 13), header={"cx": 8.5, "cy": 6.5})
    cap = load_capture(root, downscale=4, test_every=0)
    s = load_images(cap.train, downscale=4, cache_dir=tmp_path / "c")
    intr = cap.train[0].intrinsics
    assert (s.widths[0].item(), s.heights[0].item()) == (intr.width, intr.height) == (4, 3)


def test_cache_hit_skips_decoding(tmp_path, monkeypatch):
    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for i, p in enumerate(paths):
        write_image(p, 8, 6, seed=i)
    cache = tmp_path / "cache"
    first = load_images(_frames(paths), downscale=2, cache_dir=cache, num_workers=2)
    entries = sorted(cache.glob("*.npy"))
    assert len(entries) == 3 and not list(cache.glob("*.tmp"))

    def boom(data, name):
        raise AssertionError(f"decoded {name} despite the cache")

    monkeypatch.setattr(images_mod, "decode_image", boom)
    second = load_images(_frames(paths), downscale=2, cache_dir=cache, num_workers=2)
    assert torch.equal(first.pixels, second.pixels) and torch.equal(first.offsets, second.offsets)
    # Keyed by content: a copy under another name hits; another downscale or edited bytes miss.
    (tmp_path / "copy.png").write_bytes(paths[0].read_bytes())
    load_images(_frames([tmp_path / "copy.png"]), downscale=2, cache_dir=cache)
    with pytest.raises(AssertionError, match="despite the cache"):
        load_images(_frames(paths[:1]), downscale=1, cache_dir=cache)
    write_image(paths[1], 8, 6, seed=99)
    with pytest.raises(AssertionError, match="despite the cache"):
        load_images(_frames(paths[1:2]), downscale=2, cache_dir=cache)


def test_cached_headers_are_parsed_one_at_a_time(tmp_path, monkeypatch):
    """numpy parses a .npy header with ast.literal_eval, which CPython 3.11 cannot run in two threads at
    once (gh-106905: a random SystemError while loading the cache). A slow literal_eval counts how many
    threads are inside it: never more than one, and the cached pixels still come back whole."""
    import ast
    import threading
    import time

    paths = [tmp_path / f"{i}.png" for i in range(8)]
    for i, p in enumerate(paths):
        write_image(p, 6, 4, seed=i)
    cache = tmp_path / "cache"
    first = load_images(_frames(paths), cache_dir=cache, num_workers=1)
    inside, most, lock = [0], [0], threading.Lock()
    real = ast.literal_eval

    def slow_literal_eval(node_or_string):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return real(node_or_string)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", slow_literal_eval)
    again = load_images(_frames(paths), cache_dir=cache, num_workers=8)
    assert most[0] == 1
    assert torch.equal(first.pixels, again.pixels) and torch.equal(first.offsets, again.offsets)


def test_cache_dir_default_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NERF_LIGHTNING_CACHE", str(tmp_path / "envcache"))
    assert default_cache_dir() == tmp_path / "envcache"
    write_image(tmp_path / "x.png", 4, 4, seed=0)
    load_images(_frames([tmp_path / "x.png"]))
    assert len(list((tmp_path / "envcache").glob("*.npy"))) == 1
    monkeypatch.delenv("NERF_LIGHTNING_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "nerf_lightning" / "images"


def test_jpeg_and_parallel_equals_serial(tmp_path):
    """Four different JPEGs (content and size): parallel decoding keeps every view in frame order."""
    arrays, paths = [], []
    for i, (w, h) in enumerate([(32, 16), (24, 20), (32, 16), (16, 24)]):
        ramp = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
        arr = np.clip(ramp * (0.25 + 0.25 * i) + 40 * i, 0, 255).astype(np.uint8)  # distinct levels
        arr[..., i % 3] = 255 - arr[..., i % 3]
        Image.fromarray(arr).save(tmp_path / f"g{i}.jpg", quality=95)
        arrays.append(arr)
        paths.append(tmp_path / f"g{i}.jpg")
    s1 = load_images(_frames(paths), downscale=2, num_workers=1, cache_dir=tmp_path / "c1")
    s4 = load_images(_frames(paths), downscale=2, num_workers=4, cache_dir=tmp_path / "c4")
    assert torch.equal(s1.pixels, s4.pixels) and torch.equal(s1.offsets, s4.offsets) and s1.channels == 3
    assert s4.widths.tolist() == [16, 12, 16, 8] and s4.heights.tolist() == [8, 10, 8, 12]
    expected = [downscale_image(arr, 2).astype(int) for arr in arrays]
    for i, view in enumerate(s4.view(i).numpy().astype(int) for i in range(4)):
        # JPEG (chroma subsampling) is off by a few levels; views 0 and 2 (same size) by far more
        assert np.abs(view - expected[i]).max() <= 10, i
        for j in {0: [2], 2: [0]}.get(i, []):
            assert np.abs(view - expected[j]).max() > 40, (i, j)


@pytest.mark.parametrize("kind", ["truncated_png", "truncated_jpeg", "text_png"])
def test_unreadable_image_names_file(tmp_path, kind):
    good = tmp_path / ("ok.jpg" if kind == "truncated_jpeg" else "ok.png")
    write_image(good, 64, 48, seed=0)
    bad = tmp_path / f"bad{good.suffix}"
    if kind == "text_png":
        bad.write_text("this is not an image\n")
    else:
        data = good.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CaptureError, match=f"{bad.name}.*cannot decode image"):
        load_images(_frames([good, bad]), cache_dir=tmp_path / "c")


def test_cli_prints_cold_and_cached_times(make_ngp, capsys):
    root = make_ngp(n=3)
    images_mod.main([str(root), "--downscale", "2"])
    out = capsys.readouterr().out
    assert "3 images, downscale 2" in out and "cold" in out and "cached" in out


def test_a_cache_entry_of_another_size_is_decoded_again_and_replaced(tmp_path, caplog):
    """A valid .npy of the wrong size under an image's digest (a stale or foreign entry) is not used as
    the image: it is decoded again, the entry is replaced by the right pixels, and a warning says so."""
    image = tmp_path / "view.png"
    truth = write_image(image, 120, 67, seed=3)
    cache = tmp_path / "cache"
    load_images(_frames([image]), cache_dir=cache)
    (entry,) = cache.glob("*.npy")
    np.save(entry, np.zeros((5, 7, 3), dtype=np.uint8))  # a 7x5 black image
    with caplog.at_level("WARNING", logger="nerf_lightning.data.images"):
        s = load_images(_frames([image]), cache_dir=cache)
    assert (s.widths.tolist(), s.heights.tolist()) == ([120], [67])
    np.testing.assert_array_equal(s.view(0).numpy(), truth)
    np.testing.assert_array_equal(np.load(entry), truth)  # the stale entry was overwritten
    assert not list(cache.glob("*.tmp"))
    (record,) = [r for r in caplog.records if "cache entry" in r.getMessage()]
    assert record.getMessage() == (
        f"{image}: cache entry {entry} holds a 7x5 image, expected 120x67 (downscale 1); decoding again"
    )


def test_downscale_beyond_257_averages_in_wider_integers():
    """The block sums of a factor over 257 exceed uint16 (258 * 255 > 65535): still the rounded mean."""
    img = np.full((600, 900, 3), 255, dtype=np.uint8)
    img[:300, :300] = 1
    out = downscale_image(img, 300)
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out[..., 0], [[1, 255, 255], [255, 255, 255]])
