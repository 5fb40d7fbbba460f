"""What a capture's images are: renders over a transparent background, or photographs.

The training recipe of ``data.pixel_jitter=auto`` follows from it,
and it is decided from the pixels, never from the file layout: many COLMAP-to-Blender converters
write photographs as ``transforms_train.json`` / ``transforms_test.json``, and renders can come as an
instant-ngp ``transforms.json``.

``render``
    The training images carry an alpha channel and at least :data:`MIN_TRANSPARENT_FRACTION` of their
    pixels are transparent (alpha below :data:`TRANSPARENT_ALPHA`): an object rendered over an empty
    background, as the NeRF-synthetic scenes. Trained through the pixel centres (nerfacc's lego recipe).
``photo``
    Everything else: no alpha channel, or an alpha channel that is (almost) everywhere opaque.
    Trained through random points of each pixel (instant-ngp).

Both train over random background colours (``data/ray_batches.py``).

The test reads the decoded uint8 pixels already in memory (a regular subsample of at most
:data:`MAX_SAMPLES` of them), so it costs no second decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "CAPTURE_KINDS",
    "MAX_SAMPLES",
    "MIN_TRANSPARENT_FRACTION",
    "TRANSPARENT_ALPHA",
    "CaptureKind",
    "classify_pixels",
]

CAPTURE_KINDS = ("render", "photo")
#: a pixel is transparent when its alpha (0-255) is below this: more background than object
TRANSPARENT_ALPHA = 128
#: renders have at least this fraction of transparent training pixels (the NeRF-synthetic scenes:
#: 60-90 %); an opaque photograph saved with an alpha channel has none
MIN_TRANSPARENT_FRACTION = 0.01
#: pixels the test looks at, at most (a regular stride over all training pixels)
MAX_SAMPLES = 1 << 22


@dataclass(frozen=True)
class CaptureKind:
    """The kind of a capture's training images and why.

    Attributes:
        kind: ``"render"`` or ``"photo"``.
        reason: one line saying what in the images decided it.
        transparent_fraction: fraction of the sampled training pixels with alpha below
            :data:`TRANSPARENT_ALPHA` (0.0 for images without alpha).
    """

    kind: str
    reason: str
    transparent_fraction: float = 0.0

    @property
    def is_render(self) -> bool:
        return self.kind == "render"


def classify_pixels(pixels: torch.Tensor) -> CaptureKind:
    """Renders or photographs, from the packed training pixels ``[P, C]`` uint8 (``ImageSet.pixels``;
    C = 3: no alpha channel, C = 4: RGBA, images without alpha padded with 255)."""
    if pixels.dim() != 2 or pixels.shape[1] not in (3, 4):
        raise ValueError(f"classify_pixels: expected [P, 3] or [P, 4] pixels, got {tuple(pixels.shape)}")
    if pixels.shape[1] == 3:
        return CaptureKind("photo", "the images have no alpha channel")
    return kind_of_fraction(transparent_fraction(pixels))


def transparent_fraction(pixels: torch.Tensor) -> float:
    """Fraction of RGBA pixels ``[P, 4]`` (a regular stride of at most :data:`MAX_SAMPLES`) with alpha
    below :data:`TRANSPARENT_ALPHA`."""
    stride = max(1, pixels.shape[0] // MAX_SAMPLES)
    alpha = pixels[::stride, 3]
    return float(torch.count_nonzero(alpha < TRANSPARENT_ALPHA)) / max(1, alpha.numel())


def kind_of_fraction(fraction: float) -> CaptureKind:
    """The kind of RGBA training images of which ``fraction`` of the pixels are transparent."""
    share = f"{100.0 * fraction:.1f} % of the training pixels have alpha < {TRANSPARENT_ALPHA}"
    if fraction >= MIN_TRANSPARENT_FRACTION:
        return CaptureKind("render", f"RGBA images over a transparent background: {share}", fraction)
    least = f"renders have at least {100 * MIN_TRANSPARENT_FRACTION:g} %"
    return CaptureKind("photo", f"RGBA images that are opaque: {share}, {least}", fraction)
