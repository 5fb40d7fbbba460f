"""Split files: the hold-out of ``data.format=ngp`` written as Blender-layout files that another
program (instant-ngp) and this project's Blender loader read as the same cameras and pixels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.formats import CaptureError, load_capture
from nerf_lightning.data.split_files import copy_split_files, main, write_split_files

FOX = Path(__file__).resolve().parents[3] / "shared/data/fox"


def _same_pixels(a: Path, b: Path) -> None:
    np.testing.assert_array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))


def _names(doc_path: Path) -> list[str]:
    return [f["file_path"] for f in json.loads(doc_path.read_text())["frames"]]


def test_the_split_is_every_8th_usable_frame_in_file_order(make_ngp, tmp_path: Path) -> None:
    """20 frames, images 3, 7 and 12 missing: the 17 usable frames are held out at usable positions
    0, 8, 16, i.e. frames 0, 10 and 19 of the file; the rest train, in file order."""
    src = make_ngp(n=20, missing=(3, 7, 12), sharpness=[float(i) for i in range(20)])
    with pytest.warns(UserWarning, match="skipped 3 of 20 frames"):
        split = write_split_files(src, tmp_path / "split")
    usable = [i for i in range(20) if i not in (3, 7, 12)]
    assert [int(p.stem) for p in split.test] == [0, 10, 19]
    assert [int(p.stem) for p in split.train] == [i for i in usable if i not in (0, 10, 19)]
    assert _names(split.test_json) == ["images/0000.png", "images/0010.png", "images/0019.png"]
    assert _names(split.root / "transforms_val.json") == _names(split.test_json)
    # every key of the source is kept: the header in all three files, the frames' own keys
    src_doc = json.loads((src / "transforms.json").read_text())
    for name in ("train", "test", "val"):
        doc = json.loads((split.root / f"transforms_{name}.json").read_text())
        header = {k: v for k, v in doc.items() if k != "frames"}
        assert header == {k: v for k, v in src_doc.items() if k != "frames"}
    test_doc = json.loads(split.test_json.read_text())
    assert [f["sharpness"] for f in test_doc["frames"]] == [0.0, 10.0, 19.0]
    assert test_doc["frames"][1]["transform_matrix"] == src_doc["frames"][10]["transform_matrix"]


def test_the_loader_and_the_datamodule_see_the_same_capture(make_ngp, tmp_path: Path) -> None:
    """The Blender loader reads the split files as the ngp loader reads the original: the same poses,
    intrinsics and lens (k1 k2 p1 p2 in Blender-layout files too), aabb_scale, and the same pixels;
    the datamodule on the original (``data.format=ngp``) trains and validates on the split's views."""
    src = make_ngp(n=12, missing=(5,))
    with pytest.warns(UserWarning):
        split = write_split_files(src, tmp_path / "split")
        original = load_capture(src, format="ngp")
    copy = load_capture(split.root)
    assert copy.format == "blender" and (copy.aabb_scale, original.aabb_scale) == (2, 2)
    assert not copy.has_alpha  # RGB photographs in the Blender layout
    assert [f.image_path.stem for f in copy.train] == [f.image_path.stem for f in original.train]
    assert [f.image_path.stem for f in copy.test] == [f.image_path.stem for f in original.val]
    for a, b in zip(copy.train + copy.test, original.train + original.val, strict=True):
        np.testing.assert_allclose(a.c2w, b.c2w, rtol=0, atol=1e-12)
        assert a.intrinsics == b.intrinsics and a.intrinsics.model == "opencv"
        _same_pixels(a.image_path, b.image_path)
    with pytest.warns(UserWarning):
        dm = NeRFDataModule(path=str(src), format="ngp", cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
    assert [f.image_path.stem for f in dm.train_set.frames] == [p.stem for p in split.train]
    assert [f.image_path.stem for f in dm.val_set.frames] == [p.stem for p in split.test]
    blender = NeRFDataModule(path=str(split.root), val_split="test", cache_dir=str(tmp_path / "cache"))
    blender.setup("fit")
    dm.ensure_device(torch.device("cpu"))
    blender.ensure_device(torch.device("cpu"))
    for view in range(len(split.test)):  # the same rays and targets of every held-out view
        va, vb = dm.val_batch(view), blender.val_batch(view)
        for key in ("rays_o", "rays_d", "rgb", "alpha"):
            torch.testing.assert_close(va[key], vb[key], rtol=0, atol=1e-6)


def test_copy_of_a_blender_capture_reencodes_and_links(blender_capture: Path, tmp_path: Path) -> None:
    split = copy_split_files(blender_capture, tmp_path / "png")
    assert (len(split.train), len(split.test)) == (4, 3)
    assert _names(split.root / "transforms_val.json") == ["val/r_0.png", "val/r_1.png"]
    a, b = load_capture(blender_capture), load_capture(split.root)
    for x, y in zip(a.train + a.val + a.test, b.train + b.val + b.test, strict=True):
        _same_pixels(x.image_path, y.image_path)
    linked = copy_split_files(blender_capture, tmp_path / "links", images="link")
    target = linked.root / linked.names[linked.train[0]]
    assert target.is_symlink() and target.resolve() == linked.train[0].resolve()


def test_jpeg_images_become_the_pixels_the_loader_decodes(tmp_path: Path, make_ngp) -> None:
    src = make_ngp(n=9)
    doc = json.loads((src / "transforms.json").read_text())
    for f in doc["frames"]:  # the same capture with JPEG images
        png = src / f["file_path"]
        Image.open(png).convert("RGB").save(png.with_suffix(".jpg"), quality=80)
        png.unlink()
        f["file_path"] = f["file_path"][:-4] + ".jpg"
    (src / "transforms.json").write_text(json.dumps(doc))
    split = write_split_files(src, tmp_path / "split")
    for original in split.train + split.test:
        written = split.root / split.names[original]
        assert written.suffix == ".png"
        _same_pixels(written, original)


def test_bad_input_is_one_clear_error(tmp_path: Path, blender_capture: Path, make_ngp, capsys) -> None:
    with pytest.raises(CaptureError, match="no transforms.json"):
        write_split_files(blender_capture, tmp_path / "x")
    with pytest.raises(CaptureError, match="test_every must be >= 2"):
        write_split_files(make_ngp(n=4), tmp_path / "y", test_every=0)
    assert main([str(tmp_path / "nothing"), str(tmp_path / "z")]) == 2
    assert capsys.readouterr().out.startswith("error: ")


@pytest.mark.skipif(not (FOX / "transforms.json").is_file(), reason="needs ../shared/data/fox")
def test_fox_holds_out_7_of_its_50_usable_frames(tmp_path: Path) -> None:
    """fox lists 67 frames, 50 with an image: every 8th of those 50 in file order is held out."""
    frames = json.loads((FOX / "transforms.json").read_text())["frames"]
    usable = [f["file_path"] for f in frames if os.path.isfile(FOX / f["file_path"])]
    assert len(usable) == 50
    with pytest.warns(UserWarning, match="skipped 17 of 67"):
        split = write_split_files(FOX, tmp_path / "fox", images="link")
    assert [p.name for p in split.test] == [Path(u).name for u in usable[::8]]
    assert [p.name for p in split.test] == [f"{n:04d}.jpg" for n in (1, 12, 27, 42, 73, 89, 110)]
    assert len(split.train) == 43
