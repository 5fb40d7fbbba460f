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

Masks, in every format: a frame's ``mask_path`` (nerfstudio: 0 = ignore, nonzero = keep) or an
instant-ngp ``dynamic_mask_<image stem>.png`` beside its image (nonzero = ignore); masked pixels are
never training rays and are left out of the held-out PSNR (``data/masks.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.poses import (
    NGP_DEFAULT_OFFSET,
    NGP_DEFAULT_SCALE,
    nerf_to_ngp,
    ngp_to_nerf,
    normalize_nerfstudio_poses,
)
from nerf_lightning.data.transforms_json import (
    DISTORTION_KEYS,
    IMAGE_EXTENSIONS,
    CaptureError,
    hold_out_every,
    is_nonzero,
    no_frames_error,
    parse_frames,
    read_aabb_scale,
    read_number,
    read_offset3,
    read_transforms_json,
    resolve_image_path,
    warn_missing,
)
from nerf_lightning.data.types import Capture, Frame

__all__ = [
    "CaptureError",
    "FORMATS",
    "NGP_DEFAULT_SCALE",
    "detect_format",
    "load_capture",
    "nerf_to_ngp",
    "ngp_to_nerf",
    "normalize_nerfstudio_poses",
    "resolve_image_path",
]

log = logging.getLogger(__name__)

FORMATS = ("ngp", "blender", "nerfstudio")
NERFSTUDIO_DEFAULT_SCALE = 0.5
NERFSTUDIO_DEFAULT_AABB_SCALE = 4
#: a camera centre farther than this from the scene's centre (NGP units: the unit cube holds the object)
#: sees the scene as less than a pixel, and its float32 rays lose the scene altogether
MAX_CAMERA_DISTANCE = 1e6
#: a nerfstudio camera centre this many times farther from the cameras' median centre than their median
#: distance to it: one outlier that the normalization's scale would shrink every other camera to a point for
MAX_OUTLIER_RATIO = 1e6

_NERFSTUDIO_MODELS = {
    "PINHOLE": "pinhole",
    "SIMPLE_PINHOLE": "pinhole",
    "OPENCV": "opencv",
    "OPENCV_FISHEYE": "opencv_fisheye",
}


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
            f"transforms_train.json (Blender){_photos_hint(root)}"
        )
    data = read_transforms_json(json_path)
    if "camera_model" in data or "applied_transform" in data:
        return "nerfstudio"
    return "ngp"


def _photos_hint(root: Path) -> str:
    """``; its 12 photos have no camera poses: python -m nerf_lightning.process ...`` when ``root`` (or its
    ``images/``) holds photos but no capture: the process app makes one of them."""
    for folder in (root, root / "images"):
        photos = [p for p in folder.glob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()]
        if photos:
            return (
                f"; its {len(photos)} photos have no camera poses: python -m nerf_lightning.process "
                f"images={folder.resolve()} out=CAPTURE makes a capture of them, then data.path=CAPTURE"
            )
    return ""


def _ngp_camera_model(data: dict[str, Any]) -> Any:
    """The camera model of each frame of an instant-ngp style file (``ngp`` and ``blender`` layouts,
    as instant-ngp reads both): ``is_fisheye`` -> ``opencv_fisheye``, any non-zero ``k1..k4 p1 p2``
    (per frame or global) -> ``opencv``, else ``pinhole``."""
    fisheye = bool(data.get("is_fisheye", False))

    def model_of(f: dict[str, Any]) -> str:
        if fisheye or f.get("is_fisheye", False):
            return "opencv_fisheye"
        has_dist = any(is_nonzero(f.get(k, data.get(k, 0.0))) for k in DISTORTION_KEYS)
        return "opencv" if has_dist else "pinhole"

    return model_of


def _load_ngp(
    json_path: Path, downscale: int, test_every: int, min_sharpness: float | None, scale, offset, aabb_scale
) -> Capture:
    data = read_transforms_json(json_path)
    usable, missing, alpha = parse_frames(json_path, data, _ngp_camera_model(data), downscale)
    total = len(data["frames"])
    warn_missing(json_path, missing, total)
    scale, offset = _ngp_scale_offset(json_path, data, scale, offset)
    aabb = read_aabb_scale(json_path, data, 1, aabb_scale)
    posed = _to_frames(usable, scale, offset, json_path)
    frames = _sharp_frames(posed, min_sharpness, json_path, total, len(missing))
    train, val = hold_out_every(frames, test_every)
    return Capture(
        root=json_path.parent, format="ngp", train=train, val=val,
        aabb_scale=aabb, scale=scale, offset=offset, has_alpha=alpha,
    )  # fmt: skip


def _ngp_scale_offset(
    json_path: Path, data: dict[str, Any], scale: float | None, offset: Sequence[float] | None
) -> tuple[float, tuple[float, float, float]]:
    """The NGP transform of an instant-ngp style file (``ngp`` and ``blender`` layouts): ``scale`` and
    ``offset`` as given, else the file's top-level keys, else instant-ngp's defaults."""
    if scale is None:
        scale = read_number(json_path, "top level", "scale", data.get("scale", NGP_DEFAULT_SCALE))
    offset3 = read_offset3(data.get("offset", NGP_DEFAULT_OFFSET) if offset is None else offset, json_path)
    return float(scale), offset3


def _to_frames(usable, scale: float, offset: tuple[float, float, float], json_path: Path) -> list[Frame]:
    """Frames of ``parse_frames``' usable entries, their NeRF poses moved into NGP space.

    Raises:
        CaptureError: a camera centre lies more than :data:`MAX_CAMERA_DISTANCE` from the scene's centre
            (nerfstudio captures are normalized first: a far but consistent world frame passes)."""
    out = []
    for f, img, m, intr, mask in usable:
        sharp = f.get("sharpness")
        c2w = nerf_to_ngp(m, scale, offset)
        distance = float(np.linalg.norm(c2w[:3, 3] - 0.5))
        if distance > MAX_CAMERA_DISTANCE:
            raise CaptureError(
                f"{json_path}: frame {f['file_path']}: its camera centre is {distance:.3g} scene units from "
                f"the scene's centre ('transform_matrix' times scale {scale:g}); expected at most "
                f"{MAX_CAMERA_DISTANCE:g}"
            )
        out.append(
            Frame(
                image_path=img,
                c2w=c2w,
                intrinsics=intr,
                sharpness=None if sharp is None else float(sharp),
                mask_path=None if mask is None else mask[0],
                mask_kind="keep" if mask is None else mask[1],
            )
        )
    return out


def _sharp_frames(
    frames: list[Frame], min_sharpness: float | None, json_path: Path, total: int, missing: int
) -> list[Frame]:
    """The frames at least ``min_sharpness`` sharp (all when it is None); CaptureError when none is
    left (``total`` frames listed, ``missing`` of them without an image file)."""
    kept = frames
    if min_sharpness is not None:
        kept = [f for f in frames if f.sharpness is None or f.sharpness >= min_sharpness]
    dropped = len(frames) - len(kept)
    if dropped:
        log.info(
            "%s: dropped %d of %d frames with sharpness < %g", json_path, dropped, len(frames), min_sharpness
        )
    if not kept:
        raise no_frames_error(json_path, total, missing, dropped)
    return kept


def _load_blender(root: Path, downscale: int, test_every: int, scale, offset, aabb_scale) -> Capture:
    train_json = root / "transforms_train.json"
    if not train_json.is_file():
        raise CaptureError(f"{root}: no transforms file; expected transforms_train.json (Blender)")
    head = read_transforms_json(train_json)
    scale, offset3 = _ngp_scale_offset(train_json, head, scale, offset)
    aabb = read_aabb_scale(train_json, head, 1, aabb_scale)
    splits: dict[str, list[Frame]] = {}
    all_missing: list[str] = []
    total = 0
    any_alpha = False
    for split in ("train", "val", "test"):
        json_path = root / f"transforms_{split}.json"
        if not json_path.is_file():
            splits[split] = []
            continue
        data = read_transforms_json(json_path)
        usable, missing, alpha = parse_frames(json_path, data, _ngp_camera_model(data), downscale)
        any_alpha |= alpha
        total += len(data["frames"])
        all_missing += [f"{split}: {m}" for m in missing]
        splits[split] = _to_frames(usable, scale, offset3, json_path)
    warn_missing(train_json, all_missing, total)
    if not splits["train"]:
        raise no_frames_error(train_json, total, len(all_missing), 0)
    train, val = splits["train"], splits["val"]
    if not any((root / f"transforms_{split}.json").is_file() for split in ("val", "test")):
        # Only a train split: hold out frames from it rather than validating on nothing.
        train, val = hold_out_every(train, test_every)
        log.info(
            "%s: no transforms_val.json or transforms_test.json; holding out every %d-th of the %d "
            "training frames for validation (data.test_every)",
            root,
            test_every,
            len(splits["train"]),
        )
    # NeRF-synthetic renders are RGBA over a transparent background, evaluated over white;
    # photographs in this layout are opaque (the training recipe follows the pixels, not the layout)
    return Capture(
        root=root, format="blender", train=train, val=val, test=splits["test"],
        aabb_scale=aabb, scale=scale, offset=offset3, has_alpha=any_alpha, eval_background=(1.0, 1.0, 1.0),
    )  # fmt: skip


def _refuse_outlier_camera(json_path: Path, c2w: np.ndarray, frames: list[dict[str, Any]]) -> None:
    """Refuse a camera centre :data:`MAX_OUTLIER_RATIO` times farther from the cameras' median centre than
    their median distance to it (a translation of 1e30 among cameras metres apart). A far but consistent
    world frame (georeferenced cameras millions of metres from the origin) passes: the spread counts, not
    the distance from the origin."""
    centres = c2w[:, :3, 3].astype(np.float64)
    if len(centres) < 3:
        return
    distance = np.linalg.norm(centres - np.median(centres, axis=0), axis=1)
    typical = float(np.median(distance))
    worst = int(np.argmax(distance))
    if typical > 0 and distance[worst] > MAX_OUTLIER_RATIO * typical:
        raise CaptureError(
            f"{json_path}: frame {frames[worst].get('file_path')}: its camera centre is "
            f"{distance[worst]:.3g} from the cameras' median centre, {distance[worst] / typical:.3g}x their "
            f"median distance {typical:.3g}; expected at most {MAX_OUTLIER_RATIO:g}x (a broken "
            "'transform_matrix')"
        )


def _load_nerfstudio(
    json_path: Path, downscale: int, test_every: int, min_sharpness: float | None, scale, offset, aabb_scale
) -> Capture:
    data = read_transforms_json(json_path)

    def model_of(f: dict[str, Any]) -> str:
        name = str(f.get("camera_model", data.get("camera_model", "OPENCV"))).upper()
        if name not in _NERFSTUDIO_MODELS:
            raise CaptureError(
                f"{json_path}: 'camera_model' is {name!r}; supported: {', '.join(_NERFSTUDIO_MODELS)}"
            )
        return _NERFSTUDIO_MODELS[name]

    usable, missing, alpha = parse_frames(json_path, data, model_of, downscale)
    total = len(data["frames"])
    warn_missing(json_path, missing, total)
    if not usable:
        raise no_frames_error(json_path, total, len(missing), 0)
    raw = np.stack([entry[2] for entry in usable])
    _refuse_outlier_camera(json_path, raw, [entry[0] for entry in usable])
    normed, info = normalize_nerfstudio_poses(raw)
    log.info(
        "%s: nerfstudio poses normalized (centre by %s, scale %.4g)",
        json_path,
        info["center_method"],
        info["scale"],
    )
    scale = NERFSTUDIO_DEFAULT_SCALE if scale is None else float(scale)
    offset3 = read_offset3(NGP_DEFAULT_OFFSET if offset is None else offset, json_path)
    aabb = read_aabb_scale(json_path, data, NERFSTUDIO_DEFAULT_AABB_SCALE, aabb_scale)
    usable = [(f, img, normed[i], intr, mask) for i, (f, img, _, intr, mask) in enumerate(usable)]
    posed = _to_frames(usable, scale, offset3, json_path)
    frames = _sharp_frames(posed, min_sharpness, json_path, total, len(missing))

    # nerfstudio may name its split explicitly; otherwise hold out every test_every-th frame.
    if "train_filenames" in data:
        rel = {f.image_path.resolve(): f for f in frames}

        def pick(key: str) -> list[Frame]:
            names = [(json_path.parent / n).resolve() for n in data.get(key, [])]
            return [rel[n] for n in names if n in rel]

        train, val, test = pick("train_filenames"), pick("val_filenames"), pick("test_filenames")
    else:
        (train, val), test = hold_out_every(frames, test_every), []
    return Capture(
        root=json_path.parent, format="nerfstudio", train=train, val=val, test=test,
        aabb_scale=aabb, scale=scale, offset=offset3, has_alpha=alpha, world_transform=_similarity(info),
    )  # fmt: skip


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
        if path.is_symlink():  # exists() is False for a link whose target is missing or loops
            raise CaptureError(
                f"{path}: a symbolic link that leads to no file (a loop of links, or a missing target: "
                f"{os.readlink(path)}); expected a directory with transforms.json"
            )
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
        raise CaptureError(f"{root}: no transforms file; expected {json_path.name}{_photos_hint(root)}")
    loader = _load_ngp if fmt == "ngp" else _load_nerfstudio
    return loader(json_path, downscale, test_every, min_sharpness, scale, offset, aabb_scale)
