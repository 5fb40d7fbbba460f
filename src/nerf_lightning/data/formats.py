"""Capture loaders: instant-ngp ``transforms.json``, Blender synthetic and nerfstudio layouts.

Every loader returns a :class:`~nerf_lightning.data.types.Capture` whose poses are already in NGP
space (see ``types.py``). Only JSON and image *headers* are read here; pixels are decoded by
``images.load_images``.

Format summary
--------------
``ngp``
    One ``transforms.json`` as written by instant-ngp's ``colmap2nerf.py`` (e.g. the fox capture).
    Global intrinsics (``fl_x``/``fl_y`` or ``camera_angle_x``/``camera_angle_y``, ``cx``, ``cy``,
    ``w``, ``h``, ``k1 k2 k3 k4 p1 p2``, ``is_fisheye``) may be overridden per frame.
    ``scale`` (default 0.33), ``offset`` (default [0.5, 0.5, 0.5]) and ``aabb_scale`` (default 1)
    are read from the file. Validation frames: every ``test_every``-th usable frame.
``blender``
    ``transforms_{train,val,test}.json``: the NeRF synthetic scenes (``camera_angle_x``, RGBA PNGs
    whose ``file_path`` has no extension), and photographs that COLMAP-to-NeRF converters write in
    the same layout (``fl_x``/``fl_y``, ``cx``/``cy``, ``k1 k2 p1 p2``, ``aabb_scale``). Each file is
    read as instant-ngp reads it: the same intrinsics and lens keys as ``ngp`` (global or per frame),
    ``scale`` (0.33), ``offset`` (0.5) and ``aabb_scale`` (1) from ``transforms_train.json``;
    evaluated over white. The split files decide the split; a folder with only
    ``transforms_train.json`` (common in copies of the NeRF-synthetic scenes) holds out every
    ``test_every``-th training frame as validation, as captures without split files do.
``nerfstudio``
    ``transforms.json`` with ``camera_model`` (PINHOLE / OPENCV / OPENCV_FISHEYE) and/or
    ``applied_transform``. Its world frame is arbitrary, so the poses are normalized first
    (:func:`normalize_nerfstudio_poses`): rotated so that the mean camera "up" vector becomes +z,
    centred on the point closest to all optical axes (falling back to the mean camera position when
    the axes are nearly parallel, as in forward-facing captures), and scaled so that the largest
    camera coordinate is 1. The NGP transform then uses scale 0.5 and offset 0.5, which puts every
    camera centre inside the unit cube [0, 1]^3. ``aabb_scale`` defaults to 4 so that background
    beyond the cameras stays inside the outer box. ``applied_transform`` is already baked into the
    frame matrices by nerfstudio and is therefore not applied again.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.types import Capture, Frame, Intrinsics
from nerf_lightning.errors import UserError

__all__ = [
    "CaptureError",
    "FORMATS",
    "detect_format",
    "load_capture",
    "nerf_to_ngp",
    "ngp_to_nerf",
    "normalize_nerfstudio_poses",
    "resolve_image_path",
]

log = logging.getLogger(__name__)

FORMATS = ("ngp", "blender", "nerfstudio")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")
NGP_DEFAULT_SCALE = 0.33
NGP_DEFAULT_OFFSET = (0.5, 0.5, 0.5)
NERFSTUDIO_DEFAULT_SCALE = 0.5
NERFSTUDIO_DEFAULT_AABB_SCALE = 4
#: instant-ngp's largest aabb_scale
MAX_AABB_SCALE = 128

_FOCAL_KEYS = ("fl_x", "fl_y", "camera_angle_x", "camera_angle_y")
_DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
_NERFSTUDIO_MODELS = {
    "PINHOLE": "pinhole",
    "SIMPLE_PINHOLE": "pinhole",
    "OPENCV": "opencv",
    "OPENCV_FISHEYE": "opencv_fisheye",
}


class CaptureError(UserError, ValueError):
    """A capture on disk is missing, malformed or inconsistent; the message names file and key."""


# --------------------------------------------------------------------------------------------
# Pose conventions
# --------------------------------------------------------------------------------------------


def nerf_to_ngp(c2w: np.ndarray, scale: float, offset: Sequence[float] | np.ndarray) -> np.ndarray:
    """Convert a NeRF (OpenGL camera) camera-to-world matrix to NGP space, exactly as instant-ngp.

    Camera y and z axes are flipped (OpenGL -> OpenCV camera), the translation is scaled by
    ``scale`` and shifted by ``offset``, then the world rows are cycled (x, y, z) -> (y, z, x).

    Args:
        c2w: [4, 4] (or [..., 4, 4]) camera-to-world matrix in NeRF convention.
        scale: scene scale.
        offset: [3] offset added after scaling (before the row cycle, as in instant-ngp).

    Returns:
        [4, 4] (or [..., 4, 4]) float64 matrix in NGP space.
    """
    new = np.array(c2w, dtype=np.float64, copy=True)
    new[..., :, 1] *= -1
    new[..., :, 2] *= -1
    new[..., :3, 3] = new[..., :3, 3] * scale + np.asarray(offset, dtype=np.float64)
    return new[..., [1, 2, 0, 3], :]


def ngp_to_nerf(c2w: np.ndarray, scale: float, offset: Sequence[float] | np.ndarray) -> np.ndarray:
    """Inverse of :func:`nerf_to_ngp`: [4, 4] (or [..., 4, 4]) NGP matrix -> NeRF convention, float64."""
    new = np.array(c2w, dtype=np.float64, copy=True)[..., [2, 0, 1, 3], :]
    new[..., :3, 3] = (new[..., :3, 3] - np.asarray(offset, dtype=np.float64)) / scale
    new[..., :, 1] *= -1
    new[..., :, 2] *= -1
    return new


def _rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[3, 3] rotation taking unit vector ``a`` onto unit vector ``b`` (Rodrigues)."""
    v = np.cross(a, b)
    c = float(np.dot(a, b))
    s = float(np.linalg.norm(v))
    if s < 1e-12:
        if c > 0:
            return np.eye(3)
        # Opposite vectors: rotate by pi about any axis orthogonal to a.
        axis = np.cross(a, [1.0, 0.0, 0.0])
        if np.linalg.norm(axis) < 1e-6:
            axis = np.cross(a, [0.0, 1.0, 0.0])
        axis /= np.linalg.norm(axis)
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k * ((1 - c) / s**2)


def normalize_nerfstudio_poses(c2w: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Orient, centre and scale NeRF-convention poses from an arbitrary world frame.

    1. Rotate the world so that the mean camera up vector (camera +y, OpenGL) becomes +z, the up
       axis instant-ngp expects before its axis cycle.
    2. Centre on the least-squares point closest to all optical axes (camera -z). When the axes are
       nearly parallel (forward-facing captures: the 3x3 normal matrix is ill-conditioned) or that
       point lies far outside the camera cloud, use the mean camera position instead.
    3. Scale positions so that the largest absolute camera coordinate is 1.

    Args:
        c2w: [V, 4, 4] camera-to-world matrices (NeRF/OpenGL camera convention).

    Returns:
        ([V, 4, 4] float64 normalized matrices, info dict with ``rotation`` [3, 3], ``center`` [3]
        (in the rotated frame), ``scale`` and ``center_method``).
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    up = c2w[:, :3, 1].mean(axis=0)
    norm = np.linalg.norm(up)
    rot = _rotation_between(up / norm, np.array([0.0, 0.0, 1.0])) if norm > 1e-8 else np.eye(3)
    out = c2w.copy()
    out[:, :3, :3] = rot @ c2w[:, :3, :3]
    out[:, :3, 3] = c2w[:, :3, 3] @ rot.T

    pos = out[:, :3, 3]
    dirs = -out[:, :3, 2]
    dirs = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    proj = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]  # [V, 3, 3] projector off each axis
    a = proj.sum(axis=0)
    b = (proj @ pos[:, :, None]).sum(axis=0)[:, 0]
    mean = pos.mean(axis=0)
    spread = max(float(np.abs(pos - mean).max()), 1e-8)
    method = "mean"
    center = mean
    eig = np.linalg.eigvalsh(a)
    if len(pos) >= 2 and eig[0] > 1e-2 * eig[-1]:
        focus = np.linalg.solve(a, b)
        if np.linalg.norm(focus - mean) < 3.0 * spread:
            center, method = focus, "optical_axes"
    out[:, :3, 3] -= center
    extent = float(np.abs(out[:, :3, 3]).max())
    factor = 1.0 / extent if extent > 1e-8 else 1.0
    out[:, :3, 3] *= factor
    return out, {"rotation": rot, "center": center, "scale": factor, "center_method": method}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
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


def _read_header(path: Path) -> tuple[int, int, bool]:
    """(width, height, has_alpha) from an image header, without decoding pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            has_alpha = "A" in im.getbands() or "transparency" in im.info
            return int(im.size[0]), int(im.size[1]), has_alpha
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise CaptureError(f"{path}: cannot read image header ({e}); expected a PNG or JPEG image") from e


def _matrix(json_path: Path, index: int, frame: dict[str, Any]) -> np.ndarray:
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
    return m


def _number(json_path: Path, where: str, key: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise CaptureError(f"{json_path}: {where}: key '{key}' must be a number, got {value!r}") from e
    if not math.isfinite(v):
        raise CaptureError(f"{json_path}: {where}: key '{key}' must be finite, got {value!r}")
    return v


def _aabb_scale(json_path: Path, data: dict[str, Any], default: int, override: int | None) -> int:
    """The capture's ``aabb_scale`` (``override``: ``data.aabb_scale``): a power of two in 1..128."""
    if override is not None:
        value, where = override, "data.aabb_scale"
    else:
        value = _number(json_path, "top level", "aabb_scale", data.get("aabb_scale", default))
        where = f"{json_path}: key 'aabb_scale'"
    if value != int(value) or not 1 <= value <= MAX_AABB_SCALE or int(value) & (int(value) - 1):
        raise CaptureError(
            f"{where} is {value:g}: expected a power of two from 1 to {MAX_AABB_SCALE} (the outer box in "
            "units of the unit cube: 1 for an object, 16-128 for a scene with a far background)"
        )
    return int(value)


def _intrinsics(
    json_path: Path,
    index: int,
    glob: dict[str, Any],
    frame: dict[str, Any],
    header_size: tuple[int, int],
    model: str,
) -> Intrinsics:
    """Intrinsics of one frame: per-frame keys override global ones (focal keys as a group)."""
    where = f"frame {index} ({frame.get('file_path', '?')})"
    focal_src = frame if any(k in frame for k in _FOCAL_KEYS) else glob

    def get(key: str, src: dict[str, Any] | None = None) -> float | None:
        if src is not None:
            return _number(json_path, where, key, src[key]) if key in src else None
        if key in frame:
            return _number(json_path, where, key, frame[key])
        if key in glob:
            return _number(json_path, where, key, glob[key])
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
    cx, cy = get("cx"), get("cy")
    dist = {k: (get(k) or 0.0) for k in _DISTORTION_KEYS}
    if model == "pinhole":
        dist = dict.fromkeys(_DISTORTION_KEYS, 0.0)
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


def _parse_frames(
    json_path: Path,
    data: dict[str, Any],
    model_of: Any,
    downscale: int,
) -> tuple[list[tuple[dict[str, Any], Path, np.ndarray, Intrinsics]], list[str], bool]:
    """Validate all frames.

    Returns:
        (usable frames as (frame json, image path, NeRF c2w [4, 4], intrinsics), missing file_paths,
        whether any image header has alpha).
    """
    root = json_path.parent
    frames = data["frames"]
    usable, missing = [], []
    any_alpha = False
    glob = {k: v for k, v in data.items() if k != "frames"}
    if not any(k in glob for k in _FOCAL_KEYS) and not any(
        isinstance(f, dict) and any(k in f for k in _FOCAL_KEYS) for f in frames
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
        m = _matrix(json_path, i, f)
        img = resolve_image_path(root, str(f["file_path"]))
        if img is None:
            missing.append(str(f["file_path"]))
            continue
        w, h, alpha = _read_header(img)
        any_alpha |= alpha
        intr = _intrinsics(json_path, i, glob, f, (w, h), model_of(f))
        usable.append((f, img, m, intr.downscaled(downscale)))
    return usable, missing, any_alpha


def _warn_missing(json_path: Path, missing: list[str], total: int) -> None:
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        warnings.warn(
            f"{json_path}: skipped {len(missing)} of {total} frames whose image file is missing ({shown})",
            stacklevel=4,
        )


def _no_frames(json_path: Path, total: int, missing: int, blurry: int) -> CaptureError:
    return CaptureError(
        f"{json_path}: zero usable frames ({total} listed, {missing} with missing image files, "
        f"{blurry} below min_sharpness); expected at least one frame with an existing image"
    )


def _holdout(frames: list[Frame], test_every: int) -> tuple[list[Frame], list[Frame]]:
    if test_every <= 0:
        return frames, []
    train = [f for i, f in enumerate(frames) if i % test_every != 0]
    val = [f for i, f in enumerate(frames) if i % test_every == 0]
    return train, val


def _nonzero(value: Any) -> bool:
    """True unless ``value`` is a number equal to 0 (bad values are reported later by ``_number``)."""
    try:
        return float(value) != 0.0
    except (TypeError, ValueError):
        return True


def _offset3(value: Any, json_path: Path) -> tuple[float, float, float]:
    try:
        arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (3,))
    except (TypeError, ValueError) as e:
        raise CaptureError(f"{json_path}: key 'offset' must be 3 numbers, got {value!r}") from e
    if not np.isfinite(arr).all():
        raise CaptureError(f"{json_path}: key 'offset' must be 3 finite numbers, got {value!r}")
    return (float(arr[0]), float(arr[1]), float(arr[2]))


# --------------------------------------------------------------------------------------------
# Format loaders
# --------------------------------------------------------------------------------------------


def detect_format(path: Path) -> str:
    """'blender' if transforms_train.json exists; 'nerfstudio' if transforms.json has ``camera_model`` or
    ``applied_transform``; else 'ngp'. ``path`` may be a directory or a transforms file."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    if path.is_dir() and (root / "transforms_train.json").is_file():
        return "blender"
    if path.is_file() and path.name.startswith("transforms_"):
        return "blender"
    json_path = path if path.is_file() else root / "transforms.json"
    if not json_path.is_file():
        raise CaptureError(
            f"{root}: no transforms file; expected transforms.json (instant-ngp / nerfstudio) or "
            "transforms_train.json (Blender)"
        )
    data = _read_json(json_path)
    if "camera_model" in data or "applied_transform" in data:
        return "nerfstudio"
    return "ngp"


def _ngp_camera_model(data: dict[str, Any]) -> Any:
    """The camera model of each frame of an instant-ngp style file (``ngp`` and ``blender`` layouts,
    as instant-ngp reads both): ``is_fisheye`` -> ``opencv_fisheye``, any non-zero ``k1..k4 p1 p2``
    (per frame or global) -> ``opencv``, else ``pinhole``."""
    fisheye = bool(data.get("is_fisheye", False))

    def model_of(f: dict[str, Any]) -> str:
        if fisheye or f.get("is_fisheye", False):
            return "opencv_fisheye"
        has_dist = any(_nonzero(f.get(k, data.get(k, 0.0))) for k in _DISTORTION_KEYS)
        return "opencv" if has_dist else "pinhole"

    return model_of


def _load_ngp(
    json_path: Path, downscale: int, test_every: int, min_sharpness: float | None, scale, offset, aabb_scale
) -> Capture:
    data = _read_json(json_path)
    usable, missing, alpha = _parse_frames(json_path, data, _ngp_camera_model(data), downscale)
    total = len(data["frames"])
    _warn_missing(json_path, missing, total)
    scale = (
        _number(json_path, "top level", "scale", data.get("scale", NGP_DEFAULT_SCALE))
        if scale is None
        else float(scale)
    )
    offset = _offset3(data.get("offset", NGP_DEFAULT_OFFSET) if offset is None else offset, json_path)
    aabb = _aabb_scale(json_path, data, 1, aabb_scale)
    frames = _to_frames(usable, lambda m: nerf_to_ngp(m, scale, offset))
    frames, blurry = _filter_sharpness(frames, min_sharpness, json_path)
    if not frames:
        raise _no_frames(json_path, total, len(missing), blurry)
    train, val = _holdout(frames, test_every)
    return Capture(
        root=json_path.parent,
        format="ngp",
        train=train,
        val=val,
        aabb_scale=aabb,
        scale=scale,
        offset=offset,
        has_alpha=alpha,
    )


def _to_frames(usable, convert) -> list[Frame]:
    out = []
    for f, img, m, intr in usable:
        sharp = f.get("sharpness")
        out.append(
            Frame(
                image_path=img,
                c2w=convert(m),
                intrinsics=intr,
                sharpness=None if sharp is None else float(sharp),
            )
        )
    return out


def _filter_sharpness(
    frames: list[Frame], min_sharpness: float | None, json_path: Path
) -> tuple[list[Frame], int]:
    if min_sharpness is None:
        return frames, 0
    kept = [f for f in frames if f.sharpness is None or f.sharpness >= min_sharpness]
    dropped = len(frames) - len(kept)
    if dropped:
        log.info(
            "%s: dropped %d of %d frames with sharpness < %g", json_path, dropped, len(frames), min_sharpness
        )
    return kept, dropped


def _load_blender(root: Path, downscale: int, test_every: int, scale, offset, aabb_scale) -> Capture:
    train_json = root / "transforms_train.json"
    if not train_json.is_file():
        raise CaptureError(f"{root}: no transforms file; expected transforms_train.json (Blender)")
    head = _read_json(train_json)
    scale = (
        _number(train_json, "top level", "scale", head.get("scale", NGP_DEFAULT_SCALE))
        if scale is None
        else float(scale)
    )
    offset3 = _offset3(head.get("offset", NGP_DEFAULT_OFFSET) if offset is None else offset, train_json)
    aabb = _aabb_scale(train_json, head, 1, aabb_scale)
    splits: dict[str, list[Frame]] = {}
    all_missing: list[str] = []
    total = 0
    any_alpha = False
    for split in ("train", "val", "test"):
        json_path = root / f"transforms_{split}.json"
        if not json_path.is_file():
            splits[split] = []
            continue
        data = _read_json(json_path)
        usable, missing, alpha = _parse_frames(json_path, data, _ngp_camera_model(data), downscale)
        any_alpha |= alpha
        total += len(data["frames"])
        all_missing += [f"{split}: {m}" for m in missing]
        splits[split] = _to_frames(usable, lambda m: nerf_to_ngp(m, scale, offset3))
    _warn_missing(train_json, all_missing, total)
    if not splits["train"]:
        raise _no_frames(train_json, total, len(all_missing), 0)
    train, val = splits["train"], splits["val"]
    if not any((root / f"transforms_{split}.json").is_file() for split in ("val", "test")):
        # Only a train split: hold out frames from it rather than validating on nothing.
        train, val = _holdout(train, test_every)
        log.info(
            "%s: no transforms_val.json or transforms_test.json; holding out every %d-th of the %d "
            "training frames for validation (data.test_every)",
            root,
            test_every,
            len(splits["train"]),
        )
    return Capture(
        root=root,
        format="blender",
        train=train,
        val=val,
        test=splits["test"],
        aabb_scale=aabb,
        scale=scale,
        offset=offset3,
        # NeRF-synthetic renders are RGBA over a transparent background, evaluated over white;
        # photographs in this layout are opaque (the training recipe follows the pixels, not the layout)
        has_alpha=any_alpha,
        eval_background=(1.0, 1.0, 1.0),
    )


def _load_nerfstudio(
    json_path: Path, downscale: int, test_every: int, min_sharpness: float | None, scale, offset, aabb_scale
) -> Capture:
    data = _read_json(json_path)

    def model_of(f: dict[str, Any]) -> str:
        name = str(f.get("camera_model", data.get("camera_model", "OPENCV"))).upper()
        if name not in _NERFSTUDIO_MODELS:
            raise CaptureError(
                f"{json_path}: 'camera_model' is {name!r}; supported: {', '.join(_NERFSTUDIO_MODELS)}"
            )
        return _NERFSTUDIO_MODELS[name]

    usable, missing, alpha = _parse_frames(json_path, data, model_of, downscale)
    total = len(data["frames"])
    _warn_missing(json_path, missing, total)
    if not usable:
        raise _no_frames(json_path, total, len(missing), 0)
    raw = np.stack([m for _, _, m, _ in usable])
    normed, info = normalize_nerfstudio_poses(raw)
    log.info(
        "%s: nerfstudio poses normalized (centre by %s, scale %.4g)",
        json_path,
        info["center_method"],
        info["scale"],
    )
    scale = NERFSTUDIO_DEFAULT_SCALE if scale is None else float(scale)
    offset3 = _offset3(NGP_DEFAULT_OFFSET if offset is None else offset, json_path)
    aabb = _aabb_scale(json_path, data, NERFSTUDIO_DEFAULT_AABB_SCALE, aabb_scale)
    usable = [(f, img, normed[i], intr) for i, (f, img, _, intr) in enumerate(usable)]
    frames = _to_frames(usable, lambda m: nerf_to_ngp(m, scale, offset3))
    frames, blurry = _filter_sharpness(frames, min_sharpness, json_path)
    if not frames:
        raise _no_frames(json_path, total, len(missing), blurry)

    # nerfstudio may name its split explicitly; otherwise hold out every test_every-th frame.
    if "train_filenames" in data:
        rel = {f.image_path.resolve(): f for f in frames}

        def pick(key: str) -> list[Frame]:
            names = [(json_path.parent / n).resolve() for n in data.get(key, [])]
            return [rel[n] for n in names if n in rel]

        train, val, test = pick("train_filenames"), pick("val_filenames"), pick("test_filenames")
    else:
        (train, val), test = _holdout(frames, test_every), []
    return Capture(
        root=json_path.parent,
        format="nerfstudio",
        train=train,
        val=val,
        test=test,
        aabb_scale=aabb,
        scale=scale,
        offset=offset3,
        has_alpha=alpha,
        world_transform=_similarity(info),
    )


def _similarity(info: dict[str, Any]) -> np.ndarray:
    """[4, 4] matrix of ``normalize_nerfstudio_poses``'s point map p -> scale * (R p - center)."""
    m = np.eye(4)
    m[:3, :3] = info["scale"] * np.asarray(info["rotation"], dtype=np.float64)
    m[:3, 3] = -info["scale"] * np.asarray(info["center"], dtype=np.float64)
    return m


def load_capture(
    path: str | Path,
    format: str = "auto",
    downscale: int = 1,
    test_every: int = 8,
    min_sharpness: float | None = None,
    scale: float | None = None,
    offset: Sequence[float] | None = None,
    aabb_scale: int | None = None,
) -> Capture:
    """Read a capture directory (or its transforms file) into a :class:`Capture` in NGP space.

    Args:
        path: capture directory, or its ``transforms.json`` / ``transforms_train.json``.
        format: "auto" (detect, see :func:`detect_format`), "ngp", "blender" or "nerfstudio".
        downscale: integer factor >= 1; intrinsics are those of the downscaled images.
        test_every: hold out frames with index ``i % test_every == 0`` (index over usable frames, in
            file order) as validation; 0 disables the holdout. Blender folders use their split files
            and hold out from the train split only when there is neither a val nor a test split.
        min_sharpness: drop frames whose ``sharpness`` is below this value.
        scale, offset, aabb_scale: override the values from the file / format defaults.

    Raises:
        CaptureError: the path, JSON, a frame or the images are missing or malformed.
    """
    path = Path(path)
    if not path.exists():
        raise CaptureError(f"{path}: capture path does not exist (expected a directory with transforms.json)")
    if not isinstance(downscale, int) or isinstance(downscale, bool) or downscale < 1:
        raise CaptureError(f"{path}: downscale must be an integer >= 1, got {downscale!r}")
    if test_every == 1 or test_every < 0:
        raise CaptureError(f"{path}: test_every must be 0 (no holdout) or >= 2, got {test_every!r}")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise CaptureError(f"{path}: unknown format {format!r}; expected 'auto' or one of {FORMATS}")
    root = path if path.is_dir() else path.parent
    if fmt == "blender":
        return _load_blender(root, downscale, test_every, scale, offset, aabb_scale)
    json_path = path if path.is_file() else root / "transforms.json"
    if not json_path.is_file():
        raise CaptureError(f"{root}: no transforms file; expected {json_path.name}")
    loader = _load_ngp if fmt == "ngp" else _load_nerfstudio
    return loader(json_path, downscale, test_every, min_sharpness, scale, offset, aabb_scale)
