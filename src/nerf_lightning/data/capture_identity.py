"""Whether a capture is the one a checkpoint was trained on, by its training views' names and sizes.

The DataModule's state in a checkpoint (``checkpoint["NeRFDataModule"]``) holds, besides the ray sampler,
the :func:`fingerprint` of the capture it trained on: the downscale factor and each training view's image
file (relative to the capture's folder) and size. Checkpoints written before it was stored hold the
sampler's per-view sizes only: those are compared then (the count of training views and their sizes).
A capture moved to another folder keeps its names; another capture (another scene, another split,
another downscale of other images) differs in names or sizes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nerf_lightning.data.types import Capture

__all__ = ["FINGERPRINT_KEY", "capture_difference", "fingerprint"]

#: key of the fingerprint in the DataModule's state
FINGERPRINT_KEY = "capture"
#: differing views a message names at most
SHOWN = 3


def fingerprint(capture: Capture, downscale: int) -> dict[str, Any]:
    """``{"downscale": d, "train": [[name, width, height], ...]}`` of the training views (sizes at ``d``)."""
    return {
        "downscale": int(downscale),
        "train": [
            [_name(f.image_path, capture.root), int(f.intrinsics.width), int(f.intrinsics.height)]
            for f in capture.train
        ],
    }


def capture_difference(state: Any, capture: Capture, downscale: int, stored_downscale: int) -> str | None:
    """What differs between the capture a checkpoint's DataModule ``state`` was trained on and ``capture``
    (read at ``downscale``), as a phrase; None when they agree or the state says nothing of its views.

    ``stored_downscale``: the checkpoint's ``data.downscale`` (for a state without a fingerprint)."""
    if not isinstance(state, dict):
        return None
    now = fingerprint(capture, downscale)["train"]
    stored = state.get(FINGERPRINT_KEY)
    if isinstance(stored, dict) and isinstance(stored.get("train"), list):
        factor = int(stored.get("downscale", stored_downscale))
        return _named_difference(stored["train"], factor, now, downscale)
    sampler = state.get("sampler")
    if isinstance(sampler, dict) and "widths" in sampler and "heights" in sampler:
        sizes = [[None, int(w), int(h)] for w, h in zip(sampler["widths"], sampler["heights"], strict=True)]
        return _named_difference(sizes, stored_downscale, now, downscale)
    return None


def _named_difference(
    stored: list[list[Any]], stored_downscale: int, now: list[list[Any]], downscale: int
) -> str | None:
    if len(stored) != len(now):
        return f"its {len(stored)} training views, this capture's {len(now)}"
    names = [entry[0] for entry in stored]
    if all(name is not None for name in names):
        known = set(names)
        unknown = [entry[0] for entry in now if entry[0] not in known]
        if unknown:
            more = f" and {len(unknown) - SHOWN} more" if len(unknown) > SHOWN else ""
            return (
                f"this capture's training views {', '.join(unknown[:SHOWN])}{more} are not among the "
                f"checkpoint's ({', '.join(names[:SHOWN])}{', ...' if len(names) > SHOWN else ''})"
            )
    by_name = {entry[0]: entry for entry in stored}
    for i, (name, width, height) in enumerate(now):
        old = by_name[name] if name in by_name else stored[i]
        if not (_same_side(old[1], stored_downscale, width, downscale)
                and _same_side(old[2], stored_downscale, height, downscale)):  # fmt: skip
            return (
                f"training view {name} is {width}x{height} pixels at downscale {downscale}, the checkpoint's "
                f"{old[1]}x{old[2]} at downscale {stored_downscale}"
            )
    return None


def _same_side(side_a: int, factor_a: int, side_b: int, factor_b: int) -> bool:
    """Whether one full-size image side gives ``side_a`` pixels at ``factor_a`` and ``side_b`` at
    ``factor_b`` (a downscale keeps ``side // factor`` pixels)."""
    low = max(side_a * factor_a, side_b * factor_b)
    high = min((side_a + 1) * factor_a, (side_b + 1) * factor_b)
    return low < high


def _name(image: str | Path, root: Path) -> str:
    return Path(os.path.relpath(Path(image), root)).as_posix()
