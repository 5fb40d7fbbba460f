"""A COLMAP sparse model someone already solved -> the :class:`~nerf_lightning.capture.sfm.SfmResult` that
the process app's own solve would have returned (``process colmap=MODEL images=FOLDER``).

The model is read with pycolmap (text or binary: ``cameras``, ``images``, ``points3D``; COLMAP's
``sparse/0`` or a folder holding one). Its registered images must all be in ``images=`` (by their
name in the model), each camera of a model :data:`~nerf_lightning.capture.sfm.CAMERA_MODELS` has; a
model of several cameras gets per-frame intrinsics in ``transforms.json``. Whatever is refused is
one line naming the model, the image or the camera.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from nerf_lightning.capture.sfm import CAMERA_MODELS, Camera, SfmResult, import_pycolmap, result_of
from nerf_lightning.errors import UserError

__all__ = ["read_colmap_model", "scaled_result"]

_PARTS = ("cameras", "images", "points3D")


def _natural_key(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def model_folder(path: Path) -> Path:
    """``path`` itself when it holds a model, else its ``sparse/0`` or ``0``; UserError when none does."""
    for folder in (path, path / "sparse" / "0", path / "0"):
        if all((folder / f"{p}.bin").is_file() or (folder / f"{p}.txt").is_file() for p in _PARTS):
            return folder
    what = "no such folder" if not path.exists() else "no COLMAP model there"
    raise UserError(
        f"colmap={path}: {what}; expected a sparse model folder with cameras, images and points3D "
        "(.bin or .txt), e.g. COLMAP's sparse/0"
    )


def read_colmap_model(path: Path, image_dir: Path) -> tuple[SfmResult, list[Path]]:
    """The model at ``path`` as a solve's result, and the files of its registered images in ``image_dir``
    (in natural order of their names, as the app lists photos).

    Raises:
        UserError: no model, an unreadable one, a camera model without an equivalent in
            ``transforms.json``, image names with folders, or images missing from ``image_dir``.
    """
    pycolmap = import_pycolmap()
    folder = model_folder(path)
    try:
        rec = pycolmap.Reconstruction(str(folder))
    except Exception as err:  # noqa: BLE001 - pycolmap raises plain RuntimeErrors for bad files
        raise UserError(f"colmap={path}: cannot read the COLMAP model in {folder} ({err})") from err
    for cam_id, cam in sorted(rec.cameras.items()):
        if cam.model.name not in CAMERA_MODELS:
            raise UserError(
                f"colmap={path}: camera {cam_id} is a {cam.model.name} camera, which transforms.json cannot "
                f"hold; expected one of {', '.join(CAMERA_MODELS)} (undistort the images with COLMAP first: "
                "colmap image_undistorter)"
            )
    names = sorted((img.name for img in rec.images.values()), key=_natural_key)
    if not names:
        raise UserError(f"colmap={path}: the model holds no images")
    nested = [n for n in names if "/" in n or "\\" in n]
    if nested:
        raise UserError(
            f"colmap={path}: image names with folders ({nested[0]}, {len(nested)} in all) are not "
            "supported; put every image in one folder"
        )
    if not image_dir.is_dir():
        raise UserError(f"images={image_dir}: no such folder (the images of the COLMAP model)")
    missing = [n for n in names if not (image_dir / n).is_file()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise UserError(
            f"images={image_dir}: {len(missing)} of the {len(names)} images of the COLMAP model are not "
            f"there ({shown}); pass the folder the model was solved from"
        )
    result = result_of(rec, names, [0], {})
    if not result.registered:
        raise UserError(f"colmap={path}: none of the model's {len(names)} images has a pose")
    result.model_sizes = [len(result.registered)]
    return result, [image_dir / n for n in result.registered]


def scaled_result(result: SfmResult, factor: int) -> SfmResult:
    """``result`` with its cameras those of the images shrunk by ``factor`` (``process downscale=``)."""
    if factor == 1:
        return result

    def scaled(camera: Camera) -> Camera:
        return Camera(camera.model, camera.intrinsics.downscaled(factor))

    cameras = None if result.cameras is None else {n: scaled(c) for n, c in result.cameras.items()}
    return replace(result, camera=scaled(result.camera), cameras=cameras)
