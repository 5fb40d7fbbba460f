"""A folder of photos -> the capture's ``images/``: listed, checked, copied (or linked) and scored.

Photos are the JPEG and PNG files directly in the folder (not in subfolders), in natural order of
their names (``img2`` before ``img10``), the order a phone writes them in and the order the
sequential matcher pairs them in. Every photo must have the same size: the structure from motion
solves one shared camera (a photo turned between portrait and landscape is a different camera).

Pixels are used as stored, as COLMAP and the capture loader both read them, except for photos whose
EXIF orientation says they are displayed turned or mirrored: those are written upright (the pixels
the user sees) without the tag. Photos are copied unchanged (or symlinked with ``link=True``) when
nothing has to change; ``downscale=K`` writes each photo shrunk by ``K`` (block average, as the
loader's ``data.downscale`` does it).
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nerf_lightning.capture.sharpness import sharpness
from nerf_lightning.errors import UserError

__all__ = ["PHOTO_EXTENSIONS", "Photo", "list_photos", "import_photos"]

#: what COLMAP and the capture loader both read
PHOTO_EXTENSIONS = (".jpg", ".jpeg", ".png")
#: photo formats that phones and cameras write and that have to be converted first
_CONVERT_FIRST = (".heic", ".heif", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".raw", ".tif", ".tiff", ".webp")
#: EXIF tag 0x0112: 1 = upright
_ORIENTATION = 0x0112
_JPEG_QUALITY = 95


@dataclass(frozen=True)
class Photo:
    """An image of the capture: its file name in ``images/``, size (w, h), sharpness and source file."""

    name: str
    width: int
    height: int
    sharpness: float
    source: Path


def _natural_key(path: Path) -> list[object]:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", path.name)]


def list_photos(folder: str | Path) -> list[Path]:
    """The JPEG/PNG files of ``folder`` in natural name order; UserError when there is none."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "is a file, expected a folder of photos" if folder.exists() else "no such folder"
        raise UserError(f"images={folder}: {what}")
    # instant-ngp's masks live beside the photos (``dynamic_mask_<stem>.png``): not photos
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith((".", "dynamic_mask_"))]
    photos = sorted((p for p in files if p.suffix.lower() in PHOTO_EXTENSIONS), key=_natural_key)
    if not photos:
        others = Counter(p.suffix.lower() for p in files if p.suffix.lower() in _CONVERT_FIRST)
        if others:
            found = ", ".join(f"{n} {ext}" for ext, n in others.most_common())
            raise UserError(
                f"images={folder}: no JPEG or PNG photos (found {found} files): convert them to JPEG "
                "first (e.g. `mogrify -format jpg *.heic`)"
            )
        raise UserError(f"images={folder}: no photos (expected .jpg, .jpeg or .png files in the folder)")
    return photos


def _orientation(im) -> int:
    try:
        return int(im.getexif().get(_ORIENTATION, 1))
    except (AttributeError, TypeError, ValueError, OSError):
        return 1


def _unreadable(path: Path, err: Exception) -> UserError:
    return UserError(f"{path}: cannot read the photo ({err}); remove it or re-save it as JPEG")


def _upright_size(path: Path) -> tuple[int, int]:
    """(width, height) of a photo as displayed (EXIF orientations 5-8 turn it by 90 degrees)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            w, h = im.size
            return (h, w) if _orientation(im) in (5, 6, 7, 8) else (w, h)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise _unreadable(path, err) from err


def _read_upright(path: Path) -> tuple[np.ndarray, bool]:
    """Pixels of a photo, turned upright when EXIF says so; (pixels [H, W, C] uint8, was turned)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            turned = _orientation(im) != 1
            if turned:
                im = ImageOps.exif_transpose(im)
            if im.mode not in ("RGB", "RGBA"):
                im = im.convert("RGBA" if "A" in im.getbands() or "transparency" in im.info else "RGB")
            return np.asarray(im), turned
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise _unreadable(path, err) from err


def import_photos(
    paths: list[Path],
    dest: str | Path,
    downscale: int = 1,
    link: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    one_size: bool = True,
) -> list[Photo]:
    """Put the photos into ``dest`` (created): copied, linked (``link``) or rewritten when they must change.

    A photo is rewritten (JPEG quality 95, or PNG for a PNG) when ``downscale > 1`` or when its EXIF
    orientation is not upright; otherwise it is copied byte for byte, or symlinked with ``link``.
    ``one_size=False``: photos of several sizes are fine (a COLMAP model of several cameras).

    Raises:
        UserError: a photo cannot be decoded, or (``one_size``) the photos do not all have the same size.
    """
    import imageio.v3 as iio

    from nerf_lightning.data.images import downscale_image

    if one_size:
        _check_one_size(paths, [_upright_size(p) for p in paths])  # before any pixel is decoded
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    photos: list[Photo] = []
    for i, src in enumerate(paths):
        pixels, turned = _read_upright(src)
        if downscale > 1:
            pixels = downscale_image(pixels, downscale)
        target = dest / src.name
        if downscale > 1 or turned:
            if src.suffix.lower() == ".png":
                iio.imwrite(target, pixels)
            else:
                iio.imwrite(target, pixels[..., :3], quality=_JPEG_QUALITY)
        elif link:
            os.symlink(src.resolve(), target)
        else:
            shutil.copyfile(src, target)
        h, w = pixels.shape[:2]
        photos.append(Photo(name=src.name, width=w, height=h, sharpness=sharpness(pixels), source=src))
        if on_progress is not None:
            on_progress(i + 1, len(paths))
    return photos


def _check_one_size(paths: list[Path], sizes: list[tuple[int, int]]) -> None:
    counts = Counter(sizes)
    if len(counts) <= 1:
        return
    (main_w, main_h), n_main = counts.most_common(1)[0]
    odd = [(p, s) for p, s in zip(paths, sizes, strict=True) if s != (main_w, main_h)]
    shown = ", ".join(f"{p.name} ({w}x{h})" for p, (w, h) in odd[:5])
    more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
    raise UserError(
        f"images={paths[0].parent}: the photos must all have one size (one shared camera); "
        f"{n_main} are {main_w}x{main_h} but {shown}{more} are not: remove them or crop them to that size"
    )
