"""A folder of photos -> images/: natural order, copies or links, EXIF-turned photos written upright."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nerf_lightning.capture.photos import import_photos, list_photos
from nerf_lightning.capture.sharpness import sharpness
from nerf_lightning.errors import UserError


def _photo(path: Path, w: int = 40, h: int = 30, seed: int = 0, orientation: int | None = None) -> np.ndarray:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    im = Image.fromarray(pixels)
    if orientation is None:
        im.save(path)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        im.save(path, exif=exif, quality=95)
    return pixels


def test_photos_are_listed_in_natural_order(tmp_path: Path) -> None:
    for name in ["img10.jpg", "img2.JPG", "img1.png", "notes.txt", ".hidden.jpg", "b.jpeg"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "img0.jpg").write_bytes(b"x")
    assert [p.name for p in list_photos(tmp_path)] == ["b.jpeg", "img1.png", "img2.JPG", "img10.jpg"]


def test_copies_links_and_downscaled_copies(tmp_path: Path) -> None:
    src = tmp_path / "photos"
    src.mkdir()
    pixels = [_photo(src / f"p{i}.png", seed=i) for i in range(3)]
    paths = list_photos(src)

    copied = import_photos(paths, tmp_path / "copy")
    assert [p.name for p in copied] == ["p0.png", "p1.png", "p2.png"]
    assert (tmp_path / "copy/p1.png").read_bytes() == (src / "p1.png").read_bytes()
    assert not (tmp_path / "copy/p1.png").is_symlink()
    assert copied[1].sharpness == pytest.approx(sharpness(pixels[1]))
    assert (copied[0].width, copied[0].height) == (40, 30)

    linked = import_photos(paths, tmp_path / "link", link=True)
    assert os.readlink(tmp_path / "link/p2.png") == str((src / "p2.png").resolve())
    assert linked[2].sharpness == copied[2].sharpness

    small = import_photos(paths, tmp_path / "small", downscale=2)
    assert (small[0].width, small[0].height) == (20, 15)
    assert np.asarray(Image.open(tmp_path / "small/p0.png")).shape == (15, 20, 3)


def test_a_photo_shown_turned_is_written_upright(tmp_path: Path) -> None:
    src = tmp_path / "photos"
    src.mkdir()
    _photo(src / "a.jpg", w=40, h=30, orientation=6)  # displayed turned 90 degrees clockwise
    _photo(src / "b.jpg", w=30, h=40, seed=1)  # stored upright, same displayed size
    photos = import_photos(list_photos(src), tmp_path / "images")
    assert [(p.width, p.height) for p in photos] == [(30, 40), (30, 40)]
    with Image.open(tmp_path / "images/a.jpg") as im:
        assert im.size == (30, 40) and im.getexif().get(0x0112, 1) == 1
    assert (tmp_path / "images/b.jpg").read_bytes() == (src / "b.jpg").read_bytes()


def test_photos_of_different_sizes_are_refused_before_anything_is_copied(tmp_path: Path) -> None:
    src = tmp_path / "photos"
    src.mkdir()
    for i in range(3):
        _photo(src / f"p{i}.png", seed=i)
    _photo(src / "p3.png", w=30, h=40)
    with pytest.raises(UserError, match=r"one size .* 3 are 40x30 but p3\.png \(30x40\) are not"):
        import_photos(list_photos(src), tmp_path / "images")
    assert not (tmp_path / "images").exists()


def test_folders_without_photos(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"images=.*nowhere: no such folder"):
        list_photos(tmp_path / "nowhere")
    with pytest.raises(UserError, match=r"no photos \(expected \.jpg, \.jpeg or \.png"):
        list_photos(tmp_path)
    for i in range(3):
        (tmp_path / f"IMG_{i}.HEIC").write_bytes(b"x")
    with pytest.raises(UserError, match=r"no JPEG or PNG photos \(found 3 \.heic files\): convert them"):
        list_photos(tmp_path)
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(UserError, match=r"broken\.jpg: cannot read the photo"):
        import_photos(list_photos(tmp_path), tmp_path / "images")
