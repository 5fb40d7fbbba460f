"""Geometry out of a trained field: a coloured triangle mesh (marching cubes) and a coloured point cloud.

Mesh (:func:`extract_mesh`): the density is sampled at the corners of a regular grid over ``bounds``
(NGP space; by default the box of the occupancy grid's occupied cells inside the unit cube, where
instant-ngp's scene convention puts the object), set to 0 wherever the occupancy grid says the cell
is empty (so floaters the grid already pruned and never-seen space produce no surface), and
triangulated at the iso-level ``threshold`` with marching cubes (PyMCubes). Faces are oriented
outwards (against the density gradient); each vertex gets the field's colour seen from outside
along its normal.

Point cloud (:func:`render_point_cloud`): every training view rendered, each pixel whose opacity
exceeds ``min_opacity`` gives the point at its expected depth, with its rendered colour (as
nerfstudio's ``ns-export pointcloud``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nerf_lightning.ops import reference as ref
from nerf_lightning.volume.occupancy import OccupancyGrid

__all__ = [
    "Mesh",
    "corner_grid",
    "extract_mesh",
    "extraction_bytes",
    "occupied_bounds",
    "occupied_cells",
    "occupied_mask",
    "render_point_cloud",
]


@dataclass
class Mesh:
    """vertices float64 [V, 3] (NGP space), faces int64 [F, 3] (counter-clockwise seen from outside),
    colours uint8 [V, 3]."""

    vertices: np.ndarray
    faces: np.ndarray
    colors: np.ndarray


def occupied_mask(grid: OccupancyGrid, points: Tensor) -> Tensor:
    """bool [N]: the occupancy cell (of the smallest cascade containing it) of each NGP point is occupied."""
    g = grid.resolution
    c = ref.cascade_of(points).clamp(max=grid.n_cascades - 1)
    scale = torch.ldexp(torch.ones_like(points[:, 0]), c)
    ijk = ((points - 0.5) / scale[:, None] + 0.5) * g
    inside = ((ijk >= 0) & (ijk < g)).all(dim=-1)
    ijk = ijk.long().clamp(0, g - 1)
    occ = grid.binaries[c, ijk[:, 0], ijk[:, 1], ijk[:, 2]]
    return occ & inside


def occupied_cells(grid: OccupancyGrid) -> tuple[Tensor, Tensor]:
    """Centres float32 [N, 3] (NGP space) and cascade indices int64 [N] of the occupied cells, each point
    in one cell only: a cascade's cells inside the next smaller cascade's box are left out (the marcher
    uses the smaller cascade there)."""
    g = grid.resolution
    centres, cascades = [], []
    for c in range(grid.n_cascades):
        ijk = torch.nonzero(grid.binaries[c])
        rel = (ijk.float() + 0.5) / g - 0.5  # [-0.5, 0.5) of this cascade's box
        if c > 0:  # the inner half of the box belongs to cascade c - 1
            rel = rel[(rel.abs() >= 0.25).any(dim=-1)]
        centres.append(0.5 + rel * float(2**c))
        cascades.append(torch.full((len(rel),), c, dtype=torch.long, device=rel.device))
    return torch.cat(centres), torch.cat(cascades)


def occupied_bounds(grid: OccupancyGrid) -> tuple[float, ...] | None:
    """(xmin, ymin, zmin, xmax, ymax, zmax) of the occupied cells of cascade 0 (the unit cube), one cell
    of margin; None when no cell is occupied."""
    idx = torch.nonzero(grid.binaries[0])
    if idx.numel() == 0:
        return None
    g = grid.resolution
    lo = ((idx.min(dim=0).values - 1).clamp(min=0).float() / g).tolist()
    hi = ((idx.max(dim=0).values + 2).clamp(max=g).float() / g).tolist()
    return (*lo, *hi)


#: bytes per grid corner that :func:`extract_mesh` holds on the host at its peak: the density at
#: float32 (4) and float64 (8), its gradient along each axis (3 x 8) and those stacked (3 x 8)
HOST_BYTES_PER_CORNER = 60
#: bytes per point of one block of corners queried on the device: the points as built (the x column,
#: the yz pairs, both concatenated: 4 + 8 + 12), the occupancy lookup (cell coordinates at float32 and
#: int64: 12 + 24 + 24, flags) and the densities (4); the field's own working memory is not counted
BLOCK_BYTES_PER_POINT = 112


def corner_grid(bounds: Sequence[float], resolution: int) -> tuple[np.ndarray, float, np.ndarray]:
    """The marching-cubes grid over ``bounds``: its low corner, its cell size and its corners per axis
    (``resolution`` cells along the longest side)."""
    lo = np.asarray(bounds[:3], dtype=np.float64)
    hi = np.asarray(bounds[3:], dtype=np.float64)
    if len(bounds) != 6 or np.any(hi <= lo):
        raise ValueError(
            f"bounds={list(bounds)}: expected [xmin, ymin, zmin, xmax, ymax, zmax] with max > min"
        )
    step = float((hi - lo).max()) / int(resolution)
    dims = np.maximum(np.ceil((hi - lo) / step).astype(int), 1) + 1  # grid corners per axis
    return lo, step, dims


def extraction_bytes(dims: np.ndarray, chunk: int) -> tuple[int, int]:
    """(device, host) bytes that :func:`extract_mesh` holds at once for a grid of ``dims`` corners:
    a block of at least one yz-plane of corners on the device, the whole grid on the host."""
    corners = int(np.prod(dims.astype(object)))  # Python ints: no overflow at any resolution
    block = max(int(chunk), int(dims[1]) * int(dims[2]))
    return block * BLOCK_BYTES_PER_POINT, corners * HOST_BYTES_PER_CORNER


@torch.no_grad()
def extract_mesh(
    field: Callable[..., tuple[Tensor, Tensor]],
    density_fn: Callable[[Tensor], Tensor],
    grid: OccupancyGrid,
    resolution: int = 256,
    threshold: float = 10.0,
    bounds: Sequence[float] | None = None,
    chunk: int = 1 << 18,
    device: torch.device | None = None,
) -> Mesh:
    """Marching cubes of the density inside the occupied cells (see the module docstring).

    Args:
        field: ``field(positions [N, 3], directions [N, 3]) -> (sigma [N], rgb [N, 3])``.
        density_fn: ``positions [N, 3] -> sigma [N]``.
        grid: the trained occupancy grid.
        resolution: grid cells along the longest side of ``bounds`` (others in proportion).
        threshold: iso-level (density, NGP units).
        bounds: NGP box; None = :func:`occupied_bounds`.
        chunk: points per field query.
        device: where to evaluate (default: the grid's device).

    Raises:
        ValueError: nothing is occupied, or no surface at this threshold.
    """
    import mcubes

    device = device or grid.binaries.device
    if bounds is None:
        bounds = occupied_bounds(grid)
        if bounds is None:
            raise ValueError(
                "the occupancy grid has no occupied cell: nothing to mesh (was the model trained?)"
            )
    lo, step, dims = corner_grid(bounds, resolution)
    axes = [torch.linspace(float(lo[i]), float(lo[i] + step * (dims[i] - 1)), int(dims[i])) for i in range(3)]

    sigma = torch.zeros(int(np.prod(dims)), dtype=torch.float32)
    plane = int(dims[1] * dims[2])
    yz = torch.stack(torch.meshgrid(axes[1], axes[2], indexing="ij"), dim=-1).reshape(-1, 2)
    per_block = max(1, chunk // plane)
    occupied = False
    for x0 in range(0, int(dims[0]), per_block):  # a few x-planes at a time: memory stays bounded
        xs = axes[0][x0 : x0 + per_block]
        pts = torch.cat([xs.repeat_interleave(plane)[:, None], yz.repeat(len(xs), 1)], dim=1).to(device)
        keep = occupied_mask(grid, pts)
        values = torch.zeros(len(pts), device=device)
        if keep.any():
            occupied = True
            values[keep] = density_fn(pts[keep]).reshape(-1).float()
        sigma[x0 * plane : x0 * plane + len(pts)] = values.cpu()
    if not occupied:  # only given bounds can miss: the default ones are the occupied cells' box
        scene = occupied_bounds(grid)
        box = "[" + ", ".join(f"{v:.3g}" for v in scene) + "]" if scene else "none"
        raise ValueError(
            f"the box holds no occupied cell of the scene: the scene's occupied cells lie in {box} "
            "(NGP space); give bounds that overlap that box, or bounds=null (that box)"
        )
    volume = sigma.reshape(*[int(d) for d in dims]).numpy().astype(np.float64)
    verts, faces = mcubes.marching_cubes(volume, float(threshold))
    if len(faces) == 0:
        raise ValueError(
            f"no surface at threshold={threshold} (density inside the occupied cells ranges "
            f"{volume.min():.3g}..{volume.max():.3g}); lower the threshold"
        )
    faces = faces.astype(np.int64)
    # outward normals: against the density gradient (density is high inside the object)
    grad = np.stack(np.gradient(volume), axis=-1)  # [X, Y, Z, 3] per grid step
    vi = np.clip(np.round(verts).astype(int), 0, dims - 1)
    outward = -grad[vi[:, 0], vi[:, 1], vi[:, 2]]
    tri = verts[faces]
    face_n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    if np.einsum("ij,ij->", face_n, outward[faces].mean(axis=1)) < 0:
        faces = faces[:, ::-1].copy()
    norm = np.linalg.norm(outward, axis=1, keepdims=True)
    view_dirs = -outward / np.where(norm > 0, norm, 1.0)  # looking at the surface from outside
    vertices = lo + verts * step
    colors = _colors(field, vertices, view_dirs, chunk, device)
    return Mesh(vertices=vertices, faces=faces, colors=colors)


def _colors(
    field: Callable[..., tuple[Tensor, Tensor]],
    points: np.ndarray,
    dirs: np.ndarray,
    chunk: int,
    device: torch.device,
) -> np.ndarray:
    out = []
    for i in range(0, len(points), chunk):
        p = torch.as_tensor(points[i : i + chunk], dtype=torch.float32, device=device)
        d = torch.as_tensor(dirs[i : i + chunk], dtype=torch.float32, device=device)
        d = torch.where(d.norm(dim=-1, keepdim=True) > 0, d, torch.tensor([0.0, 0.0, 1.0], device=device))
        _, rgb = field(p, d)
        out.append((rgb.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 3), np.uint8)


@torch.no_grad()
def render_point_cloud(
    render_fn: Callable[[Tensor, Tensor], dict[str, Tensor]],
    rays: Sequence[tuple[Tensor, Tensor]],
    num_points: int,
    min_opacity: float = 0.9,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Points (NGP, float64 [N, 3]) and colours (uint8 [N, 3]) at the expected depth of opaque pixels.

    Args:
        render_fn: ``(rays_o, rays_d) -> {"rgb", "depth", "opacity"}`` (``Renderer.render_image``).
        rays: per view, (origins [R, 3], unit directions [R, 3]).
        num_points: at most this many points (a uniform random subset when there are more).
        min_opacity: pixels below are background / semi-transparent and give no point.
    """
    pts, cols = [], []
    for rays_o, rays_d in rays:
        out = render_fn(rays_o, rays_d)
        opacity = out["opacity"].reshape(-1)
        keep = opacity > min_opacity
        depth = out["depth"].reshape(-1)[keep] / opacity[keep]
        pts.append((rays_o[keep] + rays_d[keep] * depth[:, None]).double().cpu())
        cols.append((out["rgb"][keep].clamp(0, 1) * 255).round().to(torch.uint8).cpu())
    points = torch.cat(pts).numpy() if pts else np.zeros((0, 3))
    colors = torch.cat(cols).numpy() if cols else np.zeros((0, 3), np.uint8)
    if len(points) > num_points:
        pick = np.random.default_rng(seed).choice(len(points), num_points, replace=False)
        points, colors = points[np.sort(pick)], colors[np.sort(pick)]
    return points, colors
