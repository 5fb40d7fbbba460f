"""Masks of what moved -> the capture's ``masks/`` (``process masks=FOLDER``), listed in ``transforms.json``.

``FOLDER`` holds one mask per image, named after it: ``<image stem>.png`` in nerfstudio's convention
(0 = ignore, nonzero = keep) or ``dynamic_mask_<image stem>.png`` in instant-ngp's (nonzero = ignore).
Each is written to ``masks/<image stem>.png`` in nerfstudio's convention (255 = keep, 0 = ignore),
downscaled as the photos are (``downscale=K``: a pixel is kept only when its whole K x K block is;
``data/masks.py``), and the frame's ``mask_path`` names it. A mask of another size than its image, or
one that names no image of ``images=``, is refused before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nerf_lightning.data.masks import decode_mask, downscale_keep
from nerf_lightning.data.transforms_json import DYNAMIC_MASK_PREFIX
from nerf_lightning.errors import UserError

__all__ = ["MASKS_DIR", "find_masks", "write_masks"]

MASKS_DIR = "masks"


def find_masks(folder: Path, photos: list[Path]) -> dict[str, tuple[Path, str]]:
    """Image file name -> (its mask in ``folder``, convention ``keep`` | ``dynamic``) for the ``photos``
    that have one.

    Raises:
        UserError: ``folder`` is missing, a mask names no photo, an image has masks in both conventions,
            or a mask's size differs from its photo's.
    """
    from PIL import Image

    if not folder.is_dir():
        raise UserError(
            f"masks={folder}: no such folder (expected a folder of PNG masks named after the images)"
        )
    by_stem = {p.stem: p for p in photos}
    found: dict[str, tuple[Path, str]] = {}
    for mask in sorted(folder.glob("*.png")):
        dynamic = mask.name.startswith(DYNAMIC_MASK_PREFIX)
        stem = mask.stem[len(DYNAMIC_MASK_PREFIX) :] if dynamic else mask.stem
        photo = by_stem.get(stem)
        if photo is not None and photo.resolve() == mask.resolve():
            continue  # masks beside the photos: a PNG photo is not a mask of itself
        if photo is None:
            raise UserError(
                f"masks={folder}: {mask.name} is the mask of an image {stem}.* that images= does not hold"
            )
        if photo.name in found:
            raise UserError(
                f"masks={folder}: {photo.name} has two masks ({found[photo.name][0].name}, {mask.name})"
            )
        with Image.open(mask) as m, Image.open(photo) as p:
            if m.size != p.size:
                raise UserError(
                    f"masks={folder}: {mask.name} is {m.size[0]}x{m.size[1]} but its image {photo.name} is "
                    f"{p.size[0]}x{p.size[1]}; a mask must have its image's size"
                )
        found[photo.name] = (mask, "dynamic" if dynamic else "keep")
    return found


def write_masks(
    masks: dict[str, tuple[Path, str]], names: list[str], capture: Path, downscale: int
) -> dict[str, str]:
    """Write the masks of the images ``names`` into ``capture/masks/``; image name -> ``mask_path``."""
    import imageio.v3 as iio

    written: dict[str, str] = {}
    for name in names:
        if name not in masks:
            continue
        path, kind = masks[name]
        keep = downscale_keep(decode_mask(path.read_bytes(), kind, path), downscale)
        rel = f"{MASKS_DIR}/{Path(name).stem}.png"
        (capture / MASKS_DIR).mkdir(exist_ok=True)
        iio.imwrite(capture / rel, np.where(keep, 255, 0).astype(np.uint8))
        written[name] = rel
    return written
