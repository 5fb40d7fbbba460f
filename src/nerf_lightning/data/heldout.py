"""Which frames a run validates on, and what to say when a capture holds none out."""

from __future__ import annotations

from pathlib import Path

from nerf_lightning.data.transforms_json import CaptureError
from nerf_lightning.data.types import Capture, Frame

__all__ = [
    "NoTestSplit",
    "capture_camera_model",
    "evenly_spaced",
    "heldout_in_training",
    "no_heldout_message",
    "validation_frames",
]


class NoTestSplit(CaptureError):
    """``data.val_split=test`` on a capture without a test split (an app that sets the split from a key of
    its own, eval's ``split``, names that key instead)."""


def validation_frames(capture: Capture, split: str, path: Path) -> list[Frame]:
    """The frames validation renders for ``split`` (see ``NeRFDataModule``)."""
    if split == "test" and not capture.test:
        raise NoTestSplit(
            f"{path}: the capture has no test split (data.val_split=test); "
            "use data.val_split=val for the held-out views"
        )
    if split == "test" or (split == "auto" and capture.test):
        return capture.test
    if split == "train":
        return capture.train
    return capture.val or capture.test


def evenly_spaced(frames: list[Frame], limit: int | None) -> list[Frame]:
    """At most ``limit`` of ``frames``, evenly spaced from the first (``None``: all of them)."""
    if limit is None or len(frames) <= limit:
        return list(frames)
    stride = len(frames) / limit
    return [frames[int(i * stride)] for i in range(limit)]


def no_heldout_message(path: Path, capture: Capture, test_every: int) -> str:
    """Why a capture has no validation view, and what to change."""
    if capture.format == "blender":
        return (
            f"{path}: no held-out views to validate on: transforms_val.json / transforms_test.json list no "
            "frame with an existing image; fix those files, or remove them to hold out every "
            "data.test_every-th training frame"
        )
    if test_every == 0:
        return (
            f"{path}: no held-out views to validate on: data.test_every=0 holds out no frame and the capture "
            "has no split; set data.test_every=N (N >= 2) to hold out every Nth frame"
        )
    return (
        f"{path}: no held-out views to validate on: the capture's own split lists no validation or test "
        "frame with an existing image; add one, or remove the split to hold out every data.test_every-th "
        "frame"
    )


def capture_camera_model(capture: Capture) -> str:
    frames = capture.train or capture.val
    models = {f.intrinsics.model for f in frames}
    # frames of several cameras (per-frame intrinsics): the most general model holds them all
    for model in ("opencv_fisheye", "opencv"):
        if model in models:
            return model
    return frames[0].intrinsics.model if frames else "pinhole"


def heldout_in_training(capture: Capture) -> list[str]:
    """The held-out frames (val and test splits) whose image is also a training view's, by file: their
    scores are not held out. Names relative to the capture's folder, in split order."""
    trained = {Path(f.image_path).resolve() for f in capture.train}
    seen: dict[Path, str] = {}
    for f in [*capture.val, *capture.test]:
        path = Path(f.image_path).resolve()
        if path in trained and path not in seen:
            seen[path] = _relative(Path(f.image_path), capture.root)
    return list(seen.values())


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
