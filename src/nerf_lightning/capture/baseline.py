"""Views that cannot give a baseline: the same picture again and again.

Structure from motion triangulates points seen from different positions. Photos taken without moving
the camera (a burst, a video of a still scene from a tripod, one photo copied ten times) match
perfectly, with zero parallax: COLMAP finds no initial pair to triangulate and gives up with no
model, which reads as "too few matching features". The images are compared first, on grey 64 x 64
thumbnails: two images whose thumbnails differ by less than :data:`SAME_VIEW_LEVEL` grey levels on
average (sensor noise and JPEG re-encoding stay well below it; a step to the side moves the
picture by tens of levels) show the same view.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["SAME_VIEW_LEVEL", "distinct_views"]

#: mean absolute difference of two thumbnails (grey levels of 255) below which they show one view
SAME_VIEW_LEVEL = 1.0
_THUMB = (64, 64)


def _thumbnail(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("L").resize(_THUMB, Image.Resampling.BOX), dtype=np.float32)


def distinct_views(paths: Sequence[Path]) -> list[list[Path]]:
    """``paths`` grouped by the view they show (each group: images within :data:`SAME_VIEW_LEVEL` of
    its first image), in the order of first appearance."""
    groups: list[tuple[np.ndarray, list[Path]]] = []
    for path in paths:
        thumb = _thumbnail(Path(path))
        for first, members in groups:
            if float(np.abs(thumb - first).mean()) < SAME_VIEW_LEVEL:
                members.append(Path(path))
                break
        else:
            groups.append((thumb, [Path(path)]))
    return [members for _, members in groups]
