"""A UV texture baked from the field onto a mesh (and the vertex colours of an untextured one).

**Unwrap** (:func:`unwrap`): ``xatlas`` cuts the mesh into charts and packs them into the square
``size x size`` with a few texels between charts. Vertices on a seam are split (one copy per chart).
The mesh goes to xatlas as spatial blocks of at most :data:`UNWRAP_BLOCK_FACES` faces, charted
separately and packed together into one atlas: xatlas's chart growth costs far more than linear
in the faces of one mesh (on a 2-core CPU 8 s for 20k faces, 62 s for 50k, over 20 minutes for
200k), while blocks of 5000 faces unwrap 200k in 6 s. A block border is a seam, which a mesh of
that size has anyway: its charts are far smaller than a block.

**Texel -> surface** (:func:`rasterize_uv`): every triangle is drawn into UV space with its index
(Pillow's polygon fill), so each covered texel knows its triangle and, from its centre, its
barycentric coordinates; these give the texel's surface point and its (interpolated vertex) normal.

**Colour** (:func:`surface_colors`): the field's volume-rendered colour along rays that arrive at the
surface point from outside, through our renderer, each starting a few marching-cubes cells outside
the surface (``offset``), so that the colour is composited over the density around the iso-surface as
a camera sees it, not read at one point of it. The rays come from the ``views`` training cameras most
head-on to the surface (those in front of it, weighted by the cosine to the normal to the power
``power``), plus the head-on ray along minus the normal with a tiny weight, which alone decides where
no camera is in front. Averaged over training-view directions rather than head-on only: a field
that is not a perfect surface shows a different colour from each direction (its density is a shell a
few cells thick, and the view-dependent colour is learned only where cameras looked), and a texture
seen from the held-out cameras matches the field best with the colour those directions see on
average: on the embedded scene of the tests it is 0.4 dB closer to the field's held-out renders
than the head-on colour. The price is ``views + 1`` rays per texel, and view-dependent highlights are
baked as an average. Each ray's colour is composited over black and divided by its opacity, so the
texture holds the surface's colour, not a mix with a background; a ray that gathers (almost) no
opacity takes the field's colour at the point.

**Padding** (:func:`dilate`): texels no triangle covers take the colour of the nearest covered texel,
so bilinear filtering and mip-maps at chart borders never mix in black.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "bake_directions",
    "bake_texture",
    "dilate",
    "rasterize_uv",
    "spatial_blocks",
    "surface_colors",
    "unwrap",
]

#: a ray with less opacity than this saw (almost) nothing: the field's colour at the point instead
MIN_OPACITY = 0.05


#: faces of the largest mesh handed to xatlas at once (module docstring: why blocks)
UNWRAP_BLOCK_FACES = 5000


def spatial_blocks(vertices: np.ndarray, faces: np.ndarray, max_faces: int) -> list[np.ndarray]:
    """Face indices of each block: the faces grouped by the cell of a k x k x k grid over the mesh's box
    that holds their centroid, k the smallest giving about ``max_faces`` faces a cell on average (empty
    cells dropped). Every face is in exactly one block."""
    centroids = vertices[faces].mean(axis=1)
    k = max(1, int(np.ceil((len(faces) / max(1, max_faces)) ** (1.0 / 3.0))))
    lo, extent = centroids.min(axis=0), np.ptp(centroids, axis=0)
    cell = np.minimum((k * (centroids - lo) / np.maximum(extent, 1e-12)).astype(np.int64), k - 1)
    key = (cell[:, 0] * k + cell[:, 1]) * k + cell[:, 2]
    order = np.argsort(key, kind="stable")
    starts = np.flatnonzero(np.diff(key[order])) + 1
    return np.split(order, starts)


def unwrap(
    vertices: np.ndarray,
    faces: np.ndarray,
    size: int,
    padding: int = 4,
    block_faces: int = UNWRAP_BLOCK_FACES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """xatlas charts packed into ``size x size``: (vertex map int64 [V'], faces int64 [F, 3] into the new
    vertices, uv float32 [V', 2] in [0, 1], v up as in glTF/OBJ after their flip: row 0 of the image is
    v = 1). The faces come back grouped by block (:func:`spatial_blocks`), each with its winding."""
    import xatlas

    atlas = xatlas.Atlas()
    points = vertices.astype(np.float32)
    blocks = []
    for block in spatial_blocks(vertices, faces, block_faces):
        used, local = np.unique(faces[block], return_inverse=True)
        atlas.add_mesh(points[used], local.reshape(-1, 3).astype(np.uint32))
        blocks.append(used)
    pack = xatlas.PackOptions()
    pack.resolution = int(size)
    pack.padding = int(padding)
    pack.bilinear = True
    atlas.generate(pack_options=pack)
    vmaps, out_faces, uvs, offset = [], [], [], 0
    for i, used in enumerate(blocks):
        vmapping, indices, uv = atlas[i]
        vmaps.append(used[vmapping.astype(np.int64)])
        out_faces.append(indices.astype(np.int64) + offset)
        uvs.append(uv.astype(np.float32))
        offset += len(vmapping)
    return np.concatenate(vmaps), np.concatenate(out_faces), np.concatenate(uvs)


def rasterize_uv(uv: np.ndarray, faces: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Triangle index int64 [size, size] of each texel (-1: none) and its barycentric coordinates
    float32 [size, size, 3] (clipped to the triangle)."""
    from PIL import Image, ImageDraw

    px = np.stack([uv[:, 0] * size, (1.0 - uv[:, 1]) * size], axis=-1)  # texel units, row 0 at v = 1
    image = Image.new("I", (size, size), -1)
    draw = ImageDraw.Draw(image)
    for f, tri in enumerate(px[faces]):
        draw.polygon([tuple(p) for p in (tri - 0.5)], fill=f)  # texel centres at integer + 0.5
    face_id = np.asarray(image, dtype=np.int64)
    bary = np.zeros((size, size, 3), np.float32)
    rows, cols = np.nonzero(face_id >= 0)
    if len(rows):
        tri = px[faces[face_id[rows, cols]]]  # [N, 3, 2]
        p = np.stack([cols + 0.5, rows + 0.5], axis=-1)
        v0, v1, v2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], p - tri[:, 0]
        d00, d01, d11 = (v0 * v0).sum(-1), (v0 * v1).sum(-1), (v1 * v1).sum(-1)
        d20, d21 = (v2 * v0).sum(-1), (v2 * v1).sum(-1)
        den = d00 * d11 - d01 * d01
        den = np.where(np.abs(den) > 1e-12, den, 1e-12)
        b1, b2 = (d11 * d20 - d01 * d21) / den, (d00 * d21 - d01 * d20) / den
        b = np.clip(np.stack([1.0 - b1 - b2, b1, b2], axis=-1), 0.0, None)
        bary[rows, cols] = b / np.maximum(b.sum(-1, keepdims=True), 1e-12)
    return face_id, bary


def dilate(image: np.ndarray, covered: np.ndarray) -> np.ndarray:
    """``image`` [H, W, C] with every uncovered texel set to its nearest covered texel."""
    from scipy.ndimage import distance_transform_edt

    if covered.all() or not covered.any():
        return image
    _, (rows, cols) = distance_transform_edt(~covered, return_indices=True)
    return image[rows, cols]


def bake_directions(
    points: Tensor, normals: Tensor, cameras: Tensor | None, views: int, power: float
) -> tuple[Tensor, Tensor]:
    """Unit directions from the surface towards the eye [N, K, 3] and their weights [N, K]: the ``views``
    cameras (centres [C, 3]) most head-on to each normal, weight max(cos, 0) ** power, then the normal
    itself with a weight of 1e-6 (the fallback where no camera is in front)."""
    dirs, weights = normals[:, None], torch.full_like(normals[:, :1], 1e-6)
    if cameras is not None and len(cameras) and views > 0:
        to_eye = cameras[None] - points[:, None]  # [N, C, 3]
        to_eye = to_eye / to_eye.norm(dim=-1, keepdim=True).clamp(min=1e-8)
        cos = (to_eye * normals[:, None]).sum(-1)
        cos, idx = cos.topk(min(views, len(cameras)), dim=1)
        to_eye = torch.gather(to_eye, 1, idx[..., None].expand(-1, -1, 3))
        dirs = torch.cat([to_eye, dirs], dim=1)
        weights = torch.cat([cos.clamp(min=0) ** power, weights], dim=1)
    return dirs, weights


@torch.no_grad()
def surface_colors(
    render: Callable[[Tensor, Tensor], dict[str, Tensor]],
    field: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    points: np.ndarray,
    normals: np.ndarray,
    offset: float,
    near_plane: float,
    chunk: int,
    device: torch.device,
    cameras: np.ndarray | None = None,
    views: int = 8,
    power: float = 4.0,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Colour float32 [N, 3] in [0, 1] of the surface points seen from outside (module docstring).

    Args:
        render: ``(rays_o, rays_d) -> {"rgb", "opacity"}`` composited over black
            (``Renderer.render_image``).
        field: ``field(points, directions) -> (sigma, rgb)``, the colour of rays that see nothing.
        points, normals: NGP space, [N, 3]; normals point outwards (unit length or zero).
        offset: the ray's first sample lies this far outside the surface (NGP units).
        near_plane: the renderer's near plane: the ray starts that much farther out, so its first
            sample is at ``offset``.
        chunk: rays per render call.
        cameras: centres [C, 3] (NGP space) of the training cameras; None: head-on only.
        views, power: the cameras per point and the weight's power (:func:`bake_directions`).
        progress: called with the number of points done after each chunk.
    """
    cams = None if cameras is None else torch.tensor(cameras, dtype=torch.float32, device=device)
    per_point = 1 + (min(views, len(cams)) if cams is not None and views > 0 else 0)
    step = max(1, chunk // per_point)
    out = np.zeros((len(points), 3), np.float32)
    for i in range(0, len(points), step):
        p = torch.tensor(points[i : i + step], dtype=torch.float32, device=device)
        n = torch.tensor(normals[i : i + step], dtype=torch.float32, device=device)
        length = n.norm(dim=-1, keepdim=True)
        n = torch.where(
            length > 1e-8, n / length.clamp(min=1e-8), torch.tensor([0.0, 0.0, 1.0], device=device)
        )
        dirs, weights = bake_directions(p, n, cams, views, power)
        k = dirs.shape[1]
        start = (p[:, None] + dirs * (offset + near_plane)).reshape(-1, 3)
        result = render(start, -dirs.reshape(-1, 3))
        opacity = result["opacity"].reshape(-1, k, 1).float()
        rgb = result["rgb"].float().reshape(-1, k, 3) / opacity.clamp(min=MIN_OPACITY)
        weights = weights[..., None] * (opacity >= MIN_OPACITY)  # rays that saw nothing do not vote
        total = weights.sum(dim=1)
        rgb = (rgb * weights).sum(dim=1) / total.clamp(min=1e-12)
        missed = total[:, 0] <= 0
        if missed.any():
            rgb[missed] = field(p[missed], -n[missed])[1].float()
        out[i : i + len(p)] = rgb.clamp(0, 1).cpu().numpy()
        if progress is not None:
            progress(len(p))
    return out


def bake_texture(
    vertices: np.ndarray,
    faces: np.ndarray,
    vertex_normals: np.ndarray,
    uv: np.ndarray,
    size: int,
    colors_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """The texture uint8 [size, size, 3] of a mesh unwrapped to ``uv``: each covered texel's surface point
    and normal go to ``colors_of(points, normals) -> float [N, 3]``; then :func:`dilate`."""
    face_id, bary = rasterize_uv(uv, faces, size)
    covered = face_id >= 0
    tri = faces[face_id[covered]]  # [N, 3]
    b = bary[covered][:, :, None]  # [N, 3, 1]
    points = (vertices[tri] * b).sum(axis=1)
    normals = (vertex_normals[tri] * b).sum(axis=1)
    image = np.zeros((size, size, 3), np.float32)
    image[covered] = colors_of(points, normals)
    return (dilate(image, covered) * 255.0).round().clip(0, 255).astype(np.uint8)
