"""The fields of a ``transforms.json`` file: reading, checking and turning them into frames.

Each reader names the file, the frame and the key of what it rejects (:class:`CaptureError`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.poses import pose_defect
from nerf_lightning.data.types import Frame, Intrinsics
from nerf_lightning.errors import UserError

__all__ = [
    "DISTORTION_KEYS",
    "FOCAL_KEYS",
    "IMAGE_EXTENSIONS",
    "MAX_AABB_SCALE",
    "CaptureError",
    "hold_out_every",
    "is_nonzero",
    "no_frames_error",
    "parse_frames",
    "frame_mask",
    "read_aabb_scale",
    "read_image_header",
    "read_intrinsics",
    "read_matrix",
    "read_number",
    "read_offset3",
    "read_transforms_json",
    "resolve_image_path",
    "too_large_message",
    "warn_missing",
]

log = logging.getLogger("nerf_lightning.data.formats")

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")
#: instant-ngp's largest aabb_scale
MAX_AABB_SCALE = 128
FOCAL_KEYS = ("fl_x", "fl_y", "camera_angle_x", "camera_angle_y")
#: a focal length beyond this many pixels is a field of view under a millionth of a radian per pixel
MAX_FOCAL_PIXELS = 1e6
DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")


class CaptureError(UserError, ValueError):
    """A capture on disk is missing, malformed or inconsistent; the message names file and key."""


def read_transforms_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CaptureError(f"{path}: cannot read transforms file ({e.strerror or e})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaptureError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise CaptureError(f"{path}: expected a JSON object at top level, got {type(data).__name__}")
    frames = data.get("frames")
    if not isinstance(frames, list):
        raise CaptureError(f"{path}: expected key 'frames' holding a list of frames")
    return data


def resolve_image_path(root: Path, file_path: str) -> Path | None:
    """Image file of a frame: ``root / file_path``, else with .png/.jpg/.jpeg appended; None if absent."""
    p = root / file_path
    if p.is_file():
        return p
    for ext in IMAGE_EXTENSIONS:
        q = p.with_name(p.name + ext)
        if q.is_file():
            return q
    return None


def read_image_header(path: Path) -> tuple[int, int, bool]:
    """(width, height, has_alpha) from an image header, without decoding pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            has_alpha = "A" in im.getbands() or "transparency" in im.info
            return int(im.size[0]), int(im.size[1]), has_alpha
    except Image.DecompressionBombError as e:
        raise CaptureError(too_large_message(path, e)) from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise CaptureError(f"{path}: cannot read image header ({e}); expected a PNG or JPEG image") from e


def too_large_message(path: Path | str, err: Exception) -> str:
    """The line of an image Pillow refuses to open as a decompression bomb (``err``: its error, which
    says "Image size (N pixels) exceeds limit of M pixels")."""
    sizes = [f"{int(n):,}" for n in re.findall(r"(\d+) pixels", str(err))]
    pixels, limit = sizes if len(sizes) == 2 else ("more", "its")
    return (
        f"{path}: {pixels} pixels, over Pillow's limit of {limit} pixels per image (its guard against "
        "decompression bombs, which this program does not raise); expected a smaller image: downsize the "
        "capture's images"
    )


def read_matrix(json_path: Path, index: int, frame: dict[str, Any]) -> np.ndarray:
    where = f"{json_path}: frame {index} ({frame.get('file_path', '?')!s})"
    if "transform_matrix" not in frame:
        raise CaptureError(f"{where}: missing key 'transform_matrix' (expected a 4x4 camera-to-world matrix)")
    try:
        m = np.asarray(frame["transform_matrix"], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise CaptureError(f"{where}: 'transform_matrix' is not a numeric 4x4 matrix ({e})") from e
    if m.shape != (4, 4):
        raise CaptureError(f"{where}: 'transform_matrix' has shape {list(m.shape)}, expected [4, 4]")
    if not np.isfinite(m).all():
        raise CaptureError(f"{where}: 'transform_matrix' contains NaN or inf")
    defect = pose_defect(m)
    if defect is not None:
        raise CaptureError(f"{where}: 'transform_matrix' is not a camera pose ({defect})")
    return m


def read_number(json_path: Path, where: str, key: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise CaptureError(f"{json_path}: {where}: key '{key}' must be a number, got {value!r}") from e
    if not math.isfinite(v):
        raise CaptureError(f"{json_path}: {where}: key '{key}' must be finite, got {value!r}")
    return v


def read_aabb_scale(json_path: Path, data: dict[str, Any], default: int, override: int | None) -> int:
    """The capture's ``aabb_scale`` (``override``: ``data.aabb_scale``): a power of two in 1..128."""
    if override is not None:
        value, where = override, "data.aabb_scale"
    else:
        value = read_number(json_path, "top level", "aabb_scale", data.get("aabb_scale", default))
        where = f"{json_path}: key 'aabb_scale'"
    if value != int(value) or not 1 <= value <= MAX_AABB_SCALE or int(value) & (int(value) - 1):
        raise CaptureError(
            f"{where} is {value:g}: expected a power of two from 1 to {MAX_AABB_SCALE} (the outer box in "
            "units of the unit cube: 1 for an object, 16-128 for a scene with a far background)"
        )
    return int(value)


def read_intrinsics(
    json_path: Path,
    index: int,
    glob: dict[str, Any],
    frame: dict[str, Any],
    header_size: tuple[int, int],
    model: str,
) -> Intrinsics:
    """Intrinsics of one frame: per-frame keys override global ones (focal keys as a group)."""
    where = f"frame {index} ({frame.get('file_path', '?')})"
    focal_src = frame if any(k in frame for k in FOCAL_KEYS) else glob

    def get(key: str, src: dict[str, Any] | None = None) -> float | None:
        if src is not None:
            return read_number(json_path, where, key, src[key]) if key in src else None
        if key in frame:
            return read_number(json_path, where, key, frame[key])
        if key in glob:
            return read_number(json_path, where, key, glob[key])
        return None

    w, h = get("w"), get("h")
    hw, hh = header_size
    if w is None or h is None:
        w, h = (w or hw), (h or hh)
    w_i, h_i = int(round(w)), int(round(h))
    if (w_i, h_i) != (hw, hh):
        src = "per-frame" if ("w" in frame or "h" in frame) else "global"
        hint = "images of different sizes need per-frame intrinsics ('w', 'h', 'fl_x', 'cx', ...)"
        if (w_i, h_i) == (hh, hw):
            hint = (
                "width and height are swapped: the image was rotated by 90 degrees after the camera "
                "solve (e.g. by a tool applying its EXIF orientation); pixels are used as stored, as "
                "instant-ngp does, so keep the images the solver saw"
            )
        raise CaptureError(
            f"{json_path}: {where}: image is {hw}x{hh} but the {src} intrinsics are for {w_i}x{h_i}; {hint}"
        )
    fx, fy = get("fl_x", focal_src), get("fl_y", focal_src)
    ax, ay = get("camera_angle_x", focal_src), get("camera_angle_y", focal_src)
    from_focal = fx is not None or fy is not None
    for key, angle in (("camera_angle_x", ax), ("camera_angle_y", ay)):
        # 0 has no focal length (tan 0 = 0), pi and more a focal length <= 0 or ~0; a negative angle is
        # reported below as the negative focal length it gives
        if angle is not None and (angle == 0 or angle >= math.pi):
            raise CaptureError(
                f"{json_path}: {where}: key '{key}' is {angle:g}; expected the field of view in radians, "
                "> 0 and < pi"
            )
    if fx is None and ax is not None:
        fx = 0.5 * w / math.tan(0.5 * ax)
    if fy is None and ay is not None:
        fy = 0.5 * h / math.tan(0.5 * ay)
    if fx is None and fy is None:
        raise CaptureError(
            f"{json_path}: {where}: no intrinsics; expected 'fl_x'/'fl_y' or "
            "'camera_angle_x'/'camera_angle_y' at top level or in the frame"
        )
    fx = fy if fx is None else fx
    fy = fx if fy is None else fy
    if not (fx > 0 and fy > 0):  # a negative focal length flips the image; 0 has no rays
        keys = "'fl_x'/'fl_y'" if from_focal else "'camera_angle_x'/'camera_angle_y' (radians in (0, pi))"
        raise CaptureError(
            f"{json_path}: {where}: focal length {fx:g}, {fy:g} pixels from {keys}; expected > 0"
        )
    if max(fx, fy) > MAX_FOCAL_PIXELS:  # every ray of the image then goes one way: no view of the scene
        keys = "'fl_x'/'fl_y'" if from_focal else "'camera_angle_x'/'camera_angle_y'"
        raise CaptureError(
            f"{json_path}: {where}: focal length {fx:g}, {fy:g} pixels from {keys}; expected at most "
            f"{MAX_FOCAL_PIXELS:g} pixels"
        )
    cx, cy = get("cx"), get("cy")
    dist = {k: (get(k) or 0.0) for k in DISTORTION_KEYS}
    if model == "pinhole":
        dist = dict.fromkeys(DISTORTION_KEYS, 0.0)
    elif model == "opencv_fisheye":
        dist["p1"] = dist["p2"] = 0.0
    return Intrinsics(
        fx=fx,
        fy=fy,
        cx=0.5 * w if cx is None else cx,
        cy=0.5 * h if cy is None else cy,
        width=w_i,
        height=h_i,
        model=model,
        **dist,
    )


#: instant-ngp's mask beside an image ``x.jpg``: ``dynamic_mask_x.png`` (nonzero pixels are left out)
DYNAMIC_MASK_PREFIX = "dynamic_mask_"


def frame_mask(
    json_path: Path, index: int, frame: dict[str, Any], image: Path, size: tuple[int, int]
) -> tuple[Path, str] | None:
    """The mask of one frame and its convention (``data/masks.py``): the frame's ``mask_path``
    (nerfstudio, 0 = ignore), else ``dynamic_mask_<stem>.png`` beside its image (instant-ngp, nonzero =
    ignore), else None. A listed mask that is missing, or one of another size than ``size`` (the image's
    (w, h)), is a CaptureError."""
    where = f"{json_path}: frame {index} ({frame.get('file_path', '?')})"
    if "mask_path" in frame:
        path, kind = json_path.parent / str(frame["mask_path"]), "keep"
        if not path.is_file():
            missing = frame["mask_path"]
            raise CaptureError(f"{where}: 'mask_path' {missing} does not exist (expected a PNG mask)")
    else:
        path, kind = image.parent / f"{DYNAMIC_MASK_PREFIX}{image.stem}.png", "dynamic"
        if not path.is_file():
            return None
    w, h, _ = read_image_header(path)
    if (w, h) != size:
        raise CaptureError(
            f"{path}: mask is {w}x{h} but its image {image.name} is {size[0]}x{size[1]}; a mask must have "
            "its image's size"
        )
    return path, kind


def parse_frames(
    json_path: Path,
    data: dict[str, Any],
    model_of: Any,
    downscale: int,
) -> tuple[list[tuple[dict[str, Any], Path, np.ndarray, Intrinsics, Any]], list[str], bool]:
    """Validate all frames.

    Returns:
        (usable frames as (frame json, image path, NeRF c2w [4, 4], intrinsics, its mask (path,
        convention) or None: :func:`frame_mask`), missing file_paths, whether any image header has alpha).
    """
    root = json_path.parent
    frames = data["frames"]
    usable, missing = [], []
    any_alpha = False
    glob = {k: v for k, v in data.items() if k != "frames"}
    if not any(k in glob for k in FOCAL_KEYS) and not any(
        isinstance(f, dict) and any(k in f for k in FOCAL_KEYS) for f in frames
    ):
        raise CaptureError(
            f"{json_path}: no intrinsics at all; expected 'fl_x'/'fl_y' or 'camera_angle_x' at top level "
            "or per frame"
        )
    for i, f in enumerate(frames):
        if not isinstance(f, dict):
            raise CaptureError(f"{json_path}: frame {i} is a {type(f).__name__}, expected an object")
        if "file_path" not in f:
            raise CaptureError(f"{json_path}: frame {i}: missing key 'file_path'")
        if not isinstance(f["file_path"], str):
            kind = "null" if f["file_path"] is None else f"a {type(f['file_path']).__name__}"
            raise CaptureError(
                f"{json_path}: frame {i}: 'file_path' is {kind}; expected the image's path (a string)"
            )
        m = read_matrix(json_path, i, f)
        img = resolve_image_path(root, str(f["file_path"]))
        if img is None:
            missing.append(str(f["file_path"]))
            continue
        w, h, alpha = read_image_header(img)
        any_alpha |= alpha
        intr = read_intrinsics(json_path, i, glob, f, (w, h), model_of(f))
        usable.append((f, img, m, intr.downscaled(downscale), frame_mask(json_path, i, f, img, (w, h))))
    return usable, missing, any_alpha


def warn_missing(json_path: Path, missing: list[str], total: int) -> None:
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        warnings.warn(
            f"{json_path}: skipped {len(missing)} of {total} frames whose image file is missing ({shown})",
            stacklevel=4,
        )


def no_frames_error(json_path: Path, total: int, missing: int, blurry: int) -> CaptureError:
    return CaptureError(
        f"{json_path}: zero usable frames ({total} listed, {missing} with missing image files, "
        f"{blurry} below min_sharpness); expected at least one frame with an existing image"
    )


def hold_out_every(frames: list[Frame], test_every: int) -> tuple[list[Frame], list[Frame]]:
    if test_every <= 0:
        return frames, []
    train = [f for i, f in enumerate(frames) if i % test_every != 0]
    val = [f for i, f in enumerate(frames) if i % test_every == 0]
    return train, val


def is_nonzero(value: Any) -> bool:
    """True unless ``value`` is a number equal to 0 (bad values are reported later by ``read_number``)."""
    try:
        return float(value) != 0.0
    except (TypeError, ValueError):
        return True


def read_offset3(value: Any, json_path: Path) -> tuple[float, float, float]:
    try:
        arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (3,))
    except (TypeError, ValueError) as e:
        raise CaptureError(f"{json_path}: key 'offset' must be 3 numbers, got {value!r}") from e
    if not np.isfinite(arr).all():
        raise CaptureError(f"{json_path}: key 'offset' must be 3 finite numbers, got {value!r}")
    return (float(arr[0]), float(arr[1]), float(arr[2]))
