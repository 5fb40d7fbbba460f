"""How far a capture's images can be downscaled: the evaluation's metrics need a few pixels per side.

SSIM (torchmetrics, ``models/metrics.py``) filters with an 11x11 Gaussian window whose reflection padding
(5 pixels) must be smaller than the image: an image less than 6 pixels wide or high ends the final
evaluation with a traceback after the whole training. ``data.downscale`` is therefore checked against the
capture's images before any pixel is decoded.
"""

from __future__ import annotations

from pathlib import Path

from nerf_lightning.data.transforms_json import CaptureError, read_image_header
from nerf_lightning.data.types import Capture

__all__ = ["MIN_IMAGE_SIDE", "SSIM_WINDOW", "check_downscale"]

#: the side of SSIM's Gaussian window (torchmetrics' default, which the metrics use)
SSIM_WINDOW = 11
#: the fewest pixels per side of an evaluated image: SSIM pads each side by ``SSIM_WINDOW // 2``, and a
#: padding must be smaller than the image
MIN_IMAGE_SIDE = SSIM_WINDOW // 2 + 1


def check_downscale(capture: Capture, downscale: int, path: Path, key: str = "data.downscale") -> None:
    """Refuse a ``downscale`` that leaves any of ``capture``'s images (read at that factor) smaller than
    :data:`MIN_IMAGE_SIDE` pixels per side, naming ``key`` and the largest factor that works.

    Raises:
        CaptureError: ``data.downscale=256: images/0001.png of CAPTURE would be 0x0 pixels, ...``.
    """
    frames = [*capture.train, *capture.val, *capture.test]
    small = [f for f in frames if min(f.intrinsics.width, f.intrinsics.height) < MIN_IMAGE_SIDE]
    if not small:
        return
    # the full sizes, read again from the headers only on the way to a refusal
    full = {Path(f.image_path): read_image_header(Path(f.image_path))[:2] for f in frames}
    smallest = min(full, key=lambda p: min(full[p]))
    width, height = full[smallest]
    window = f"{SSIM_WINDOW}x{SSIM_WINDOW}"
    need = f"the metrics need at least {MIN_IMAGE_SIDE} pixels per side (SSIM's {window} window)"
    largest = min(width, height) // MIN_IMAGE_SIDE
    if largest < 1:
        raise CaptureError(f"{smallest}: the image is {width}x{height} pixels; {need}: expected larger ones")
    first = small[0]
    shrunk = f"{first.intrinsics.width}x{first.intrinsics.height}"
    raise CaptureError(
        f"{key}={downscale}: {Path(first.image_path).name} of {path} would be {shrunk} pixels, and {need}; "
        f"the largest {key} for this capture is {largest} (its smallest image, {smallest.name}, is "
        f"{width}x{height} pixels)"
    )
