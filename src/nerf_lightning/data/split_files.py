"""A capture's train / held-out split written out as Blender-layout split files.

``write_split_files(src, out)`` reads an instant-ngp ``transforms.json`` capture (no split files)
with the project's loader and writes ``out/transforms_train.json``, ``out/transforms_test.json`` and
``out/transforms_val.json`` (the same views as test, as in the NeRF-synthetic scenes) holding exactly
the split that ``data.format=ngp data.test_every=N`` trains and evaluates on: every Nth *usable*
frame, in file order, held out (frames whose image file is missing are not usable and are left out,
as the loader skips them). Every top-level key of the source file is copied unchanged (intrinsics,
lens, ``aabb_scale``, ``scale``, ``offset``), and each frame keeps all its keys but ``file_path``, so
the project's Blender loader and instant-ngp read the same cameras from the split files as from the
original (the split files need ``aabb_scale`` in the test file too: instant-ngp resets its network
when the test file's ``aabb_scale`` differs from the training file's).

Images (``images=``):

``png`` (default)
    Each image decoded as the loader decodes it (``images.decode_image``) and written losslessly at its
    path relative to the capture folder with ``.png`` (``out/images/0001.png`` for fox's
    ``images/0001.jpg``): another program reads exactly the pixels this project trains on (no second
    JPEG decoder, no WebP reader needed).
``link``
    Symbolic links to the original files at the same relative paths.

Uses: the side-by-side runs with instant-ngp on the same views (``bench/peers.py``), and a real capture
in the Blender layout that COLMAP-to-NeRF converters write (opaque photographs with ``fl_x``/``cx``/
``k1..p2``, ``aabb_scale`` > 1), whose training recipe must follow the images, not the layout.

``copy_split_files(src, out)`` does the same for a capture that has split files (e.g. lego's WebP
renders, which instant-ngp cannot read).

    python -m nerf_lightning.data.split_files SRC_CAPTURE OUT_DIR [--test-every 8] [--images png|link]
"""

from __future__ import annotations

import argparse
import io
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nerf_lightning.data.formats import CaptureError, load_capture, resolve_image_path
from nerf_lightning.data.images import decode_image
from nerf_lightning.utils.io import atomic_write_bytes, atomic_write_json

__all__ = ["IMAGE_MODES", "SplitFiles", "copy_split_files", "write_split_files"]

IMAGE_MODES = ("png", "link")


@dataclass(frozen=True)
class SplitFiles:
    """What :func:`write_split_files` wrote.

    Attributes:
        root: the output folder.
        train, test: the original image paths of each split, in the loader's (file) order.
        names: original image path -> its ``file_path`` in the split files.
    """

    root: Path
    train: list[Path]
    test: list[Path]
    names: dict[Path, str]

    @property
    def train_json(self) -> Path:
        return self.root / "transforms_train.json"

    @property
    def test_json(self) -> Path:
        return self.root / "transforms_test.json"


def write_split_files(
    src: str | Path, out: str | Path, test_every: int = 8, images: str = "png", workers: int | None = None
) -> SplitFiles:
    """Write ``src``'s split (``data.format=ngp data.test_every=test_every``) as Blender split files.

    Args:
        src: an instant-ngp capture folder (or its ``transforms.json``) without split files.
        out: output folder (created); existing split files and images of the same names are replaced.
        test_every: the held-out stride over usable frames (>= 2).
        images: ``png`` (lossless copies of the decoded pixels) or ``link`` (symbolic links).
        workers: image-writing threads (default: up to 8).

    Raises:
        CaptureError: ``src`` is not an instant-ngp capture, or its split holds out no frame.
    """
    if test_every < 2:
        raise CaptureError(f"{src}: test_every must be >= 2 to hold out frames, got {test_every}")
    src = Path(src)
    json_path = src if src.is_file() else src / "transforms.json"
    if not json_path.is_file():
        raise CaptureError(f"{src}: no transforms.json (an instant-ngp capture without split files expected)")
    capture = load_capture(json_path, format="ngp", test_every=test_every)
    if not capture.val:
        raise CaptureError(f"{json_path}: no held-out frame with test_every={test_every}")
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    by_image = _frames_by_image(json_path.parent, doc["frames"])
    header = {k: v for k, v in doc.items() if k != "frames"}

    def rows(frames: Sequence[Any]) -> list[tuple[dict[str, Any], Path]]:
        return [(by_image[Path(f.image_path)], Path(f.image_path)) for f in frames]

    test = rows(capture.val)
    splits = {"train": (header, rows(capture.train)), "test": (header, test), "val": (header, test)}
    return _write(json_path.parent, Path(out), splits, images, workers)


def copy_split_files(
    src: str | Path, out: str | Path, images: str = "png", workers: int | None = None
) -> SplitFiles:
    """Copy a Blender-layout capture's split files with its images re-encoded (``images="png"``: e.g.
    WebP renders for a reader without WebP) or linked; frames whose image is missing are left out, as
    the loader skips them. ``transforms_val.json`` is copied when it exists, else written as the test
    split."""
    src = Path(src)
    if not (src / "transforms_train.json").is_file() or not (src / "transforms_test.json").is_file():
        raise CaptureError(f"{src}: expected transforms_train.json and transforms_test.json (Blender layout)")
    splits: dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], Path]]]] = {}
    for split in ("train", "test", "val"):
        json_path = src / f"transforms_{split}.json"
        if not json_path.is_file():
            continue
        doc = json.loads(json_path.read_text(encoding="utf-8"))
        by_image = _frames_by_image(src, doc["frames"])
        header = {k: v for k, v in doc.items() if k != "frames"}
        splits[split] = (header, [(f, p) for p, f in by_image.items()])
    splits.setdefault("val", splits["test"])
    return _write(src, Path(out), splits, images, workers)


def _write(
    src_root: Path,
    out: Path,
    splits: dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], Path]]]],
    images: str,
    workers: int | None,
) -> SplitFiles:
    """Write the images and ``transforms_<split>.json`` of each split (header + frames with the new
    ``file_path``, every other key kept)."""
    if images not in IMAGE_MODES:
        raise ValueError(f"images must be one of {IMAGE_MODES}, got {images!r}")
    paths = list(dict.fromkeys(p for _, frames in splits.values() for _, p in frames))
    names = _output_names(paths, src_root, images)
    for name in set(names.values()):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
    jobs = [(p, out / names[p], images) for p in paths]
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(_write_image, jobs))
    for split, (header, frames) in splits.items():
        rows = [{**frame, "file_path": names[p]} for frame, p in frames]
        atomic_write_json(out / f"transforms_{split}.json", {**header, "frames": rows})
    return SplitFiles(
        root=out,
        train=[p for _, p in splits["train"][1]],
        test=[p for _, p in splits["test"][1]],
        names=names,
    )


def _frames_by_image(root: Path, frames: list[dict[str, Any]]) -> dict[Path, dict[str, Any]]:
    """Each usable frame's JSON object by its image path as the loader resolves it (first wins)."""
    out: dict[Path, dict[str, Any]] = {}
    for f in frames:
        img = resolve_image_path(root, str(f["file_path"]))
        if img is not None:
            out.setdefault(img, f)
    return out


def _output_names(paths: list[Path], root: Path, images: str) -> dict[Path, str]:
    """Each image's path relative to the capture folder (``images/<name>`` for one outside it), with
    ``.png`` for re-encoded images; a name taken twice (``a.jpg`` and ``a.png``) gets its index."""
    names: dict[Path, str] = {}
    taken: set[str] = set()
    for i, p in enumerate(paths):
        try:
            rel = p.resolve().relative_to(root.resolve())
        except ValueError:
            rel = Path("images") / p.name
        rel = rel.with_suffix(".png") if images == "png" else rel
        if rel.as_posix() in taken:
            rel = rel.with_name(f"{i:04d}_{rel.name}")
        taken.add(rel.as_posix())
        names[p] = rel.as_posix()
    return names


def _write_image(job: tuple[Path, Path, str]) -> None:
    src, dst, mode = job
    if mode == "link":
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        dst.symlink_to(src.resolve())
        return
    from PIL import Image

    arr = decode_image(src.read_bytes(), src)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=1)
    atomic_write_bytes(dst, buf.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="instant-ngp capture folder (transforms.json, no split files)")
    ap.add_argument("out", type=Path, help="output folder for transforms_{train,test,val}.json and images/")
    ap.add_argument("--test-every", type=int, default=8)
    ap.add_argument("--images", choices=IMAGE_MODES, default="png")
    args = ap.parse_args(argv)
    try:
        if (args.src / "transforms_train.json").is_file():
            split = copy_split_files(args.src, args.out, args.images)
        else:
            split = write_split_files(args.src, args.out, args.test_every, args.images)
    except CaptureError as err:
        print(f"error: {err}")
        return 2
    print(f"{split.root}: {len(split.train)} train / {len(split.test)} test views ({args.images} images)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
