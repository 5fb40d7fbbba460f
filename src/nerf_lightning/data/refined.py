"""The capture with its training poses replaced by the learned ones, as a capture ``train`` reads back.

After a run with learned camera poses (``model.net.camera_opt``), ``<run>/refined/`` holds a copy of the
capture's transforms file(s) (``transforms.json``; a Blender capture's ``transforms_{train,val,test}.json``)
in which:

- every training frame's ``transform_matrix`` is its refined pose, mapped back from NGP space into the
  capture's own world frame and camera convention (``SceneSpace.pose_to_capture``), so the file means
  what the original meant (same ``scale``, ``offset``, ``aabb_scale``, intrinsics, splits);
- held-out frames keep their given poses, number for number;
- image (and split) paths are absolute, so the folder needs no images of its own.

``python -m nerf_lightning.train data.path=<run>/refined`` trains on the refined poses (with the same
``data.*`` overrides as the original run: e.g. an ``aabb_scale`` override is not written into the file).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.data.transforms_json import resolve_image_path
from nerf_lightning.data.types import Capture
from nerf_lightning.utils.io import atomic_write_json

__all__ = ["write_refined_capture", "transforms_files"]

log = logging.getLogger(__name__)

#: per-frame keys holding paths relative to the capture folder
_FRAME_PATH_KEYS = ("file_path", "mask_path", "depth_file_path")
#: nerfstudio's split lists (paths relative to the capture folder)
_SPLIT_KEYS = ("train_filenames", "val_filenames", "test_filenames")


def transforms_files(capture: Capture, source: Path) -> list[Path]:
    """The transforms file(s) ``capture`` was read from (``source``: the path given to the loader)."""
    source = Path(source)
    if capture.format == "blender":
        return [p for s in ("train", "val", "test") if (p := capture.root / f"transforms_{s}.json").is_file()]
    return [source if source.is_file() else capture.root / "transforms.json"]


def _absolute(root: Path, value: str) -> str:
    """A frame's path made absolute: the image it resolves to (with its extension), else ``root / value``."""
    found = resolve_image_path(root, value)
    return str((found if found is not None else root / value).resolve())


def write_refined_capture(capture: Capture, source: Path, refined_ngp: np.ndarray, out_dir: Path) -> Path:
    """Write ``capture``'s transforms file(s) into ``out_dir`` with the training frames' poses replaced.

    Args:
        capture: the capture as loaded (its ``train`` frames in the order of ``refined_ngp``).
        source: the path it was loaded from (a folder or a transforms file).
        refined_ngp: float [V, 3, 4] (or [V, 4, 4]) refined NGP-space camera-to-world of the training
            views (``CameraOptimizer.refined_poses``).
        out_dir: destination folder (created); each file is written atomically.

    Returns:
        The path of the written ``transforms.json`` (Blender: ``transforms_train.json``).
    """
    refined = np.asarray(refined_ngp, dtype=np.float64)
    if refined.shape[0] != len(capture.train) or refined.shape[1:] not in ((3, 4), (4, 4)):
        raise ValueError(
            f"write_refined_capture: expected [{len(capture.train)}, 3, 4] refined poses, got {refined.shape}"
        )
    full = np.tile(np.eye(4), (refined.shape[0], 1, 1))
    full[:, :3, :] = refined[:, :3, :]
    in_capture = SceneSpace.of(capture).pose_to_capture(full)
    by_image = {Path(f.image_path).resolve(): in_capture[i] for i, f in enumerate(capture.train)}
    root = capture.root
    written: list[Path] = []
    replaced: set[Path] = set()
    for path in transforms_files(capture, source):
        with open(path) as f:
            doc: dict[str, Any] = json.load(f)
        out = copy.deepcopy(doc)
        for frame in out.get("frames", []):
            if not isinstance(frame, dict) or "file_path" not in frame:
                continue
            image = resolve_image_path(root, str(frame["file_path"]))
            key = image.resolve() if image is not None else None
            if key in by_image:
                frame["transform_matrix"] = by_image[key].tolist()
                replaced.add(key)
            for name in _FRAME_PATH_KEYS:
                if isinstance(frame.get(name), str):
                    frame[name] = _absolute(root, frame[name])
        for name in _SPLIT_KEYS:
            if isinstance(out.get(name), list):
                out[name] = [str((root / n).resolve()) for n in out[name]]
        out["refined_from"] = str(Path(path).resolve())
        # Blender keeps its three file names; the others become the folder's transforms.json
        target = Path(out_dir) / (path.name if capture.format == "blender" else "transforms.json")
        atomic_write_json(target, out)
        written.append(target)
    missing = len(by_image) - len(replaced)
    if missing:
        log.warning("refined poses: %d training frames were not found in %s", missing, written)
    main = next((p for p in written if p.name in ("transforms.json", "transforms_train.json")), written[0])
    return main
