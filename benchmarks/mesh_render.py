"""A small ray-casting rasterizer for exported meshes: what the texture-fidelity test and the README's
screenshot see (``trimesh`` ray casting, ``rtree`` for its triangle tree).

A pixel's ray hits the nearest triangle; its colour is the base-colour texture sampled bilinearly at the
hit's interpolated UV (a textured mesh) or the vertex colours interpolated at the hit (a PLY).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

__all__ = ["cast", "held_out_psnr", "shade"]


def cast(
    mesh, origins: np.ndarray, directions: np.ndarray, chunk: int = 512
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001, E501
    """Nearest hits: (hit bool [R], triangle int64 [R], barycentric float64 [R, 3]) of unit rays [R, 3]."""
    import trimesh

    caster = trimesh.ray.ray_triangle.RayMeshIntersector(mesh)
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


def held_out_psnr(run_dir: Path, scene: Path, mesh, up: str, views: int | None = None) -> float:  # noqa: ANN001
    """Mean PSNR (dB) of the mesh seen from the held-out cameras against the field's renders of those views,
    over the object's pixels (the field's opacity > 0.95 and the mesh hit there, one pixel in from the
    silhouette). The mesh's rays come from transforms.json itself (capture frame, OpenGL pinhole
    cameras, scaled to the loaded images' size), ``up`` as the export wrote it; ``views``: the first few
    held-out views only."""
    import torch
    from scipy.ndimage import binary_erosion

    from nerf_lightning.data.cameras import intrinsics_tensor, pixel_rays, poses_tensor
    from nerf_lightning.run.restore import load_run

    doc = json.loads((scene / "transforms.json").read_text())
    poses = {Path(f["file_path"]).name: np.asarray(f["transform_matrix"]) for f in doc["frames"]}
    run = load_run(run_dir)
    model, capture = run.build_model(), run.load_capture()
    w, h = capture.val[0].intrinsics.width, capture.val[0].intrinsics.height
    k = w / doc["w"]  # data.downscale
    fx, fy, cx, cy = (doc[key] * k for key in ("fl_x", "fl_y", "cx", "cy"))
    iy, ix = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
    scores = []
    for frame in capture.val[:views]:
        c2w = poses[frame.image_path.name]
        d = np.stack([(ix - cx) / fx, -(iy - cy) / fy, -np.ones_like(ix)], -1).reshape(-1, 3) @ c2w[:3, :3].T
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        o = np.broadcast_to(c2w[:3, 3], d.shape).copy()
        if up == "y":  # +Z up -> +Y up: (x, y, z) -> (x, z, -y)
            o, d = o[:, [0, 2, 1]] * [1, 1, -1], d[:, [0, 2, 1]] * [1, 1, -1]
        rgb, hit = shade(mesh, o, d)
        n = w * h
        ro, rd = pixel_rays(poses_tensor([frame]).expand(n, 3, 4), intrinsics_tensor([frame]).expand(n, 10),
                            torch.tensor(ix.reshape(-1), dtype=torch.float32),
                            torch.tensor(iy.reshape(-1), dtype=torch.float32), model="pinhole")  # fmt: skip
        with torch.no_grad():
            ref = model.renderer.render_image(model.field, ro, rd, torch.ones(3))
        obj = binary_erosion((hit & (ref["opacity"].reshape(-1).numpy() > 0.95)).reshape(h, w)).reshape(-1)
        err = ((rgb[obj] - ref["rgb"].clamp(0, 1).numpy()[obj]) ** 2).mean()
        scores.append(-10 * math.log10(err))
    return float(np.mean(scores))
