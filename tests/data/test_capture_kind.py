"""Renders or photographs, from the training pixels: the rule behind ``data.pixel_jitter=auto`` (the
datamodule-level test is in ``test_datamodule.py``)."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.data.capture_kind import classify_pixels


def _rgba(n: int, transparent: int, alpha: int = 0) -> torch.Tensor:
    """``n`` RGBA pixels, the first ``transparent`` of them with ``alpha``, the rest opaque."""
    px = torch.full((n, 4), 200, dtype=torch.uint8)
    px[:, 3] = 255
    px[:transparent, 3] = alpha
    return px


def test_rgb_pixels_are_photographs() -> None:
    kind = classify_pixels(torch.zeros(1000, 3, dtype=torch.uint8))
    assert (kind.kind, kind.transparent_fraction) == ("photo", 0.0)
    assert kind.reason == "the images have no alpha channel"


def test_rgba_with_a_transparent_background_is_a_render() -> None:
    kind = classify_pixels(_rgba(1000, 600))  # 60 % background, as the NeRF-synthetic renders
    assert kind.kind == "render" and kind.is_render
    assert kind.transparent_fraction == pytest.approx(0.6)
    assert "60.0 % of the training pixels have alpha < 128" in kind.reason


def test_opaque_rgba_is_a_photograph() -> None:
    """An alpha channel that is 255 everywhere (a photograph saved as RGBA) says nothing about empty
    space: photographs, like RGB."""
    kind = classify_pixels(_rgba(1000, 0))
    assert kind.kind == "photo" and kind.transparent_fraction == 0.0
    assert "opaque" in kind.reason


@pytest.mark.parametrize(
    ("transparent", "alpha", "kind"),
    [(10, 0, "render"),  # 1.0 %: the threshold
     (9, 0, "photo"),  # 0.9 %: a few masked pixels do not make a render
     (500, 127, "render"),  # mostly transparent
     (500, 128, "photo")],  # half-opaque and more counts as object
)
def test_the_thresholds(transparent: int, alpha: int, kind: str) -> None:
    assert classify_pixels(_rgba(1000, transparent, alpha)).kind == kind


def test_large_captures_are_sampled_not_scanned_whole() -> None:
    """Above MAX_SAMPLES pixels a regular stride is read: 9M pixels of which the first 25 % are
    transparent give 25 % (to the stride's granularity)."""
    n = 9_000_000
    kind = classify_pixels(_rgba(n, n // 4))
    assert kind.kind == "render" and kind.transparent_fraction == pytest.approx(0.25, abs=1e-6)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"expected \[P, 3\] or \[P, 4\] pixels"):
        classify_pixels(torch.zeros(10, 2, dtype=torch.uint8))
