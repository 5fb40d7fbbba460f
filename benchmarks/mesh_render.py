"""A small ray-casting rasterizer for exported meshes: what the texture-fidelity test and the README's
screenshot see (``trimesh`` ray casting: embree when ``embreex`` is installed, else ``rtree`` for its
triangle tree).

A pixel's ray hits the nearest triangle; its colour is the base-colour texture sampled bilinearly at the
hit's interpolated UV (a textured mesh) or the vertex colours interpolated at the hit (a PLY).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nerf_lightning.data.types import Capture, Frame
    from nerf_lightning.run.restore import RestoredRun

__all__ = ["cast", "held_out_psnr", "held_out_views", "shade", "view_rays"]


def cast(
    mesh, origins: np.ndarray, directions: np.ndarray, chunk: int = 512
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001, E501
    """Nearest hits: (hit bool [R], triangle int64 [R], barycentric float64 [R, 3]) of unit rays [R, 3],
    through trimesh's ray caster (embree when ``embreex`` is installed, else its own triangle tree)."""
    import trimesh

    caster = mesh.ray
    hit = np.zeros(len(origins), bool)
    tri = np.zeros(len(origins), np.int64)
    bary = np.zeros((len(origins), 3))
    for i in range(0, len(origins), chunk):  # each ray's box candidates grow with the mesh: bounded memory
        locations, index_ray, index_tri = caster.intersects_location(
            origins[i : i + chunk], directions[i : i + chunk], multiple_hits=False
        )
        index_ray = index_ray + i
        hit[index_ray], tri[index_ray] = True, index_tri
        if len(index_ray):
            bary[index_ray] = trimesh.triangles.points_to_barycentric(mesh.triangles[index_tri], locations)
    return hit, tri, bary


def shade(
    mesh, origins: np.ndarray, directions: np.ndarray, background: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001, E501
    """Colour float [R, 3] in [0, 1] (``background`` where nothing is hit) and the hit mask [R]."""
    hit, tri, bary = cast(mesh, origins, directions)
    rgb = np.full((len(origins), 3), float(background))
    faces = mesh.faces[tri[hit]]
    b = bary[hit][:, :, None]
    uv = getattr(mesh.visual, "uv", None)
    if uv is not None:
        image = np.asarray(mesh.visual.material.baseColorTexture.convert("RGB"), np.float64) / 255.0
        rgb[hit] = _bilinear(image, (uv[faces] * b).sum(axis=1))
    else:
        colors = np.asarray(mesh.visual.vertex_colors[:, :3], np.float64) / 255.0
        rgb[hit] = (colors[faces] * b).sum(axis=1)
    return rgb, hit


def _bilinear(image: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """``image`` [H, W, 3] at ``uv`` [N, 2] (v up: v = 1 is row 0; texel centres at half-integers)."""
    h, w = image.shape[:2]
    x = np.clip(uv[:, 0] * w - 0.5, 0, w - 1)
    y = np.clip((1.0 - uv[:, 1]) * h - 0.5, 0, h - 1)
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]
    top = image[y0, x0] * (1 - fx) + image[y0, x1] * fx
    bottom = image[y1, x0] * (1 - fx) + image[y1, x1] * fx
    return top * (1 - fy) + bottom * fy


def view_rays(frame, space, up: str | None, width: int | None = None):  # noqa: ANN001, ANN201
    """The rays of one view through pixel centres, ``width`` pixels wide at most (None: the view's own):
    (NGP origins, NGP directions) as torch tensors for the field, and (origins, unit directions) as numpy
    arrays in the mesh file's frame (the capture frame, ``up`` as the export wrote it; NGP space where
    ``space`` is None), and the image's (h, w)."""
    import torch

    from nerf_lightning.data.cameras import intrinsics_tensor, pixel_rays, poses_tensor
    from nerf_lightning.mesh.formats import to_up

    w0, h0 = frame.intrinsics.width, frame.intrinsics.height
    k = max(1.0, w0 / width) if width else 1.0
    w, h = int(w0 / k), int(h0 / k)
    iy, ix = np.meshgrid((np.arange(h) + 0.5) * k, (np.arange(w) + 0.5) * k, indexing="ij")
    n = w * h
    px, py = (torch.tensor(a.reshape(-1), dtype=torch.float32) for a in (ix, iy))
    ro, rd = pixel_rays(poses_tensor([frame]).expand(n, 3, 4), intrinsics_tensor([frame]).expand(n, 10),
                        px, py, model=frame.intrinsics.model)  # fmt: skip
    o, d = ro.double().numpy(), rd.double().numpy()
    if space is not None:  # a similarity: points map, directions follow from two points of the ray
        o, d = space.points_to_capture(o), space.points_to_capture(o + d) - space.points_to_capture(o)
        if up is not None:
            o, d = to_up(o, up), to_up(d, up)
    return ro, rd, o, d / np.linalg.norm(d, axis=1, keepdims=True), (h, w)


def held_out_views(run: RestoredRun) -> tuple[Capture, list[Frame]]:
    """(the run's capture, the held-out views it validated on): ``data.val_split``'s frames, the test split
    where the capture has no val split (lego's official split)."""
    from nerf_lightning.data.heldout import validation_frames

    dm = run.build_datamodule()
    capture = run.load_capture()
    return capture, validation_frames(capture, dm.val_split, dm.resolve_path())


def held_out_psnr(
    run_dir: Path,
    mesh,
    up: str | None,
    views: int | None = None,
    width: int | None = None,
    space: str = "capture",
) -> float:  # noqa: ANN001
    """Mean PSNR (dB) of the mesh seen from the held-out cameras against the field's renders of those views,
    over the object's pixels (the field's opacity > 0.95 and the mesh hit there, one pixel in from the
    silhouette). The mesh's rays are the views' own rays mapped into the file's frame (``up`` as the
    export wrote it; ``space="ngp"``: NGP coordinates); ``views``: the first few held-out views only;
    ``width``: views rendered at most that many pixels wide."""
    import torch
    from scipy.ndimage import binary_erosion

    from nerf_lightning.data.scene_space import SceneSpace
    from nerf_lightning.run.restore import load_run

    run = load_run(run_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = run.build_model().to(device)
    capture, frames = held_out_views(run)
    frame_space = SceneSpace.of(capture) if space == "capture" else None
    scores = []
    for frame in frames[:views]:
        ro, rd, o, d, (h, w) = view_rays(frame, frame_space, up, width)
        rgb, hit = shade(mesh, o, d)
        with torch.no_grad():
            ref = model.renderer.render_image(
                model.field, ro.to(device), rd.to(device), torch.ones(3, device=device)
            )
        opacity, ref_rgb = ref["opacity"].reshape(-1).cpu().numpy(), ref["rgb"].clamp(0, 1).cpu().numpy()
        obj = binary_erosion((hit & (opacity > 0.95)).reshape(h, w)).reshape(-1)
        err = ((rgb[obj] - ref_rgb[obj]) ** 2).mean()
        scores.append(-10 * math.log10(err))
    return float(np.mean(scores))
