"""Hydra app: export the geometry of a trained checkpoint as an asset (glb, obj, ply) or a point cloud.

    python -m nerf_lightning.export mesh ckpt=PATH [format=glb|obj|ply] [faces=200000] [texture_size=2048]
    python -m nerf_lightning.export pointcloud ckpt=PATH [num_points=1000000]

``mesh``: marching cubes over the density inside the occupancy grid's occupied cells
(``mesh/extract.py``), cleaned (largest pieces, Taubin smoothing) and decimated (``mesh/clean.py``),
then a UV texture baked from the field as the training cameras most head-on to the surface see it
(``mesh/texture.py``; ``ply``: vertex colours), written as glTF binary, OBJ + MTL + PNG or PLY
(``mesh/formats.py``). ``pointcloud`` (or ``mesh ... pointcloud=true``): ``pointcloud.ply``, points at
the expected depth of the training views' opaque pixels with their rendered colours. Coordinates are in
the capture's own world frame and units (``up``: +Y for glb/obj, the capture's +Z for ply) or, with
``space=ngp``, in NGP space. Files go into ``out`` or the run folder, written atomically; one summary
line per file. See ``conf/export.yaml`` for every option.
"""

from __future__ import annotations

import functools
import io
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from omegaconf import DictConfig

from nerf_lightning.apps.config_checks import check_bounds, check_config
from nerf_lightning.apps.entry import device_of, hydra_app, nested_overrides
from nerf_lightning.config_schema import Note, PowerOfTwo, Range
from nerf_lightning.data.cameras import intrinsics_tensor, pixel_rays, poses_tensor
from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.errors import UserError, writing_to
from nerf_lightning.mesh.clean import clean_mesh
from nerf_lightning.mesh.extract import (
    corner_grid,
    extract_mesh,
    extraction_bytes,
    occupied_bounds,
    render_point_cloud,
)
from nerf_lightning.mesh.formats import encode, to_up, write_files
from nerf_lightning.mesh.texture import bake_texture, surface_colors, unwrap
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.run.restore import load_run
from nerf_lightning.utils.io import atomic_write_bytes, atomic_write_json
from nerf_lightning.utils.memory import check_fits

log = logging.getLogger("nerf_lightning.export")

#: the bake's rays start this many marching-cubes cells outside the surface: past the density's
#: fall-off around the iso-surface, close enough not to start behind a neighbouring fold
BAKE_OFFSET_CELLS = 3.0
#: the bake weighs each training camera by cos(normal, camera) ** this: the most head-on views count most
#: (4 scored 0.2 dB above 1 on the embedded scene of the tests)
BAKE_POWER = 4.0


@dataclass(frozen=True)
class ExportOptions:
    """The export's own keys (``conf/export.yaml``, where each is described)."""

    what: Literal["mesh", "pointcloud"]
    space: Literal["capture", "ngp"]
    resolution: Annotated[int, Range(low=1), Note("grid cells along the longest side")]
    threshold: float
    bounds: list[float] | None  # checked by check_bounds
    chunk: Annotated[int, Range(low=1)]
    format: Literal["glb", "obj", "ply"]
    texture: bool
    texture_size: Annotated[int, PowerOfTwo(), Range(high=8192), Note("texels per side")]
    bake_views: Annotated[int, Range(low=0), Note("training cameras per texel")]
    faces: Annotated[int, Range(low=1), Note("the most triangles of the mesh")]
    min_component: Annotated[float, Range(low=0, high=1), Note("a fraction of the largest piece's faces")]
    smooth: Annotated[int, Range(low=0), Note("smoothing iterations")]
    up: Annotated[Literal["y", "z"] | None, Note("null: y for glb and obj, z for ply")]
    out: str | None
    pointcloud: bool
    num_points: Annotated[int, Range(low=1)]
    pointcloud_downscale: Annotated[int, Range(low=1)]
    min_opacity: Annotated[float, Range(low=0, high=1)]

    @property
    def up_axis(self) -> str:
        """``up=null``: glTF's +Y for glb and the OBJ importers' +Y for obj; the capture's frame for ply."""
        return self.up if self.up is not None else ("z" if self.format == "ply" else "y")


def _write_ply(path: Path, geometry: Any) -> None:
    data = geometry.export(file_type="ply")  # binary PLY with vertex colours
    atomic_write_bytes(path, data if isinstance(data, bytes) else io.BytesIO(data).getvalue())


def _to_output_space(points: np.ndarray, space: SceneSpace | None) -> np.ndarray:
    return points if space is None else space.points_to_capture(points)


def _output_points(points: np.ndarray, space: SceneSpace | None, up: str) -> np.ndarray:
    """NGP points -> the file's coordinates: capture frame in the ``up`` convention, or NGP space."""
    return points if space is None else to_up(space.points_to_capture(points), up)


def export_mesh(
    opts: ExportOptions,
    folder: Path,
    model: Any,
    space: SceneSpace | None,
    device: torch.device,
    cameras: np.ndarray | None = None,
) -> dict[str, Any]:
    """The mesh asset into ``folder``; ``cameras``: the training cameras' centres [C, 3] (NGP space) the
    colours are seen from."""
    import trimesh

    t0 = time.perf_counter()
    bounds = opts.bounds
    try:
        mesh = extract_mesh(
            model.field,
            model.field.density,
            model.occupancy,
            resolution=opts.resolution,
            threshold=opts.threshold,
            bounds=bounds,
            chunk=opts.chunk,
            device=device,
        )
    except ValueError as err:
        raise UserError(f"export mesh (threshold={opts.threshold}, bounds={bounds}): {err}") from err
    stages: dict[str, float] = {}
    last = [t0]

    def lap(stage: str) -> None:  # seconds since the previous stage ended
        now = time.perf_counter()
        stages[stage], last[0] = now - last[0], now

    lap("extract")
    cell = float(np.ptp(mesh.vertices, axis=0).max()) / opts.resolution  # marching-cubes cell (NGP)
    vertices, faces = clean_mesh(mesh.vertices, mesh.faces, opts.min_component, opts.smooth, opts.faces)
    normals = np.asarray(trimesh.Trimesh(vertices, faces, process=False).vertex_normals)
    lap("clean")
    bg = torch.zeros(3, device=device)
    colors_of = functools.partial(
        _bake_colors,
        render=lambda o, d: model.renderer.render_image(model.field, o, d, bg, chunk=opts.chunk // 4),
        field=model.field,
        offset=BAKE_OFFSET_CELLS * cell,
        near_plane=float(model.renderer.near_plane),
        chunk=opts.chunk // 4,
        device=device,
        cameras=cameras,
        views=opts.bake_views,
        power=BAKE_POWER,
    )
    fmt, up, size = opts.format, opts.up_axis, opts.texture_size
    textured = opts.texture and fmt != "ply"
    uv = texture = colors = None
    if textured:
        vmap, faces, uv = unwrap(vertices, faces, size)
        vertices, normals = vertices[vmap], normals[vmap]
        lap("unwrap")
        texture = bake_texture(vertices, faces, normals, uv, size, colors_of)
    else:
        colors = (colors_of(vertices, normals) * 255).round().astype(np.uint8)
    lap("bake")
    out_vertices = _output_points(vertices, space, up)
    if np.linalg.det(_output_points(np.eye(3), space, up) - _output_points(np.zeros((1, 3)), space, up)) < 0:
        faces = faces[:, ::-1].copy()  # a mirroring frame: keep the faces counter-clockwise from outside
    files = encode(fmt, out_vertices, faces, uv=uv, texture=texture, colors=colors)
    paths = write_files(folder, files)
    lap("write")
    seconds = last[0] - t0
    lo, hi = out_vertices.min(axis=0), out_vertices.max(axis=0)
    frame = "NGP space" if space is None else f"capture units, +{up.upper()} up"
    print(
        f"{paths[-1]}: {len(faces)} triangles, "
        + (f"texture {size}x{size}, " if textured else "vertex colours, ")
        + f"bounds [{', '.join(f'{v:.3g}' for v in lo)}]..[{', '.join(f'{v:.3g}' for v in hi)}] ({frame}), "
        + f"{seconds:.1f} s"
    )
    return {
        "mesh": str(paths[-1]),
        "files": [str(p) for p in paths],
        "format": fmt,
        "up": up if space is not None else None,
        "vertices": len(out_vertices),
        "faces": len(faces),
        "texture_size": size if textured else None,
        "bounds": [lo.tolist(), hi.tolist()],
        "seconds": seconds,
        "stage_seconds": {k: round(v, 2) for k, v in stages.items()},  # where the time went
    }


def check_mesh_fits(opts: ExportOptions, model: Any, device: torch.device) -> None:
    """The marching-cubes grid of ``resolution`` over the mesh's bounds fits in the memory available,
    before it is allocated (``mesh/extract.extraction_bytes``)."""
    bounds = opts.bounds if opts.bounds is not None else occupied_bounds(model.occupancy)
    if bounds is None:
        return  # nothing occupied: extract_mesh says so
    _lo, _step, dims = corner_grid(bounds, opts.resolution)
    device_bytes, host_bytes = extraction_bytes(dims, opts.chunk)
    shape = "x".join(str(int(d)) for d in dims)
    check_fits(
        f"export mesh resolution={opts.resolution}: a grid of {shape} corners",
        device,
        device_bytes,
        host_bytes,
        "lower resolution",
    )


def _bake_colors(points: np.ndarray, normals: np.ndarray, **kwargs: Any) -> np.ndarray:
    """``surface_colors`` of the points with a progress bar (one ray per point)."""
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(f"baking {len(points)} surface colours", total=len(points))
        return surface_colors(
            points=points, normals=normals, progress=lambda n: bar.advance(task, n), **kwargs
        )


def check_out_folder(folder: Path) -> list[Path]:
    """``out=``: a folder this process can create and write files in, checked before any work; returns
    the folders it created (deepest first), for :func:`remove_empty` when the export fails."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check."):
            pass
    except OSError as err:
        remove_empty(created)
        raise UserError(f"out={folder}: cannot write there ({(err.strerror or str(err)).lower()})") from err
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty: a failed export leaves no folder behind."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return  # not empty (or gone): neither it nor its parents are ours to remove


def export_pointcloud(
    opts: ExportOptions,
    folder: Path,
    model: Any,
    capture: Any,
    space: SceneSpace | None,
    device: torch.device,
) -> dict[str, Any]:
    import trimesh

    k = opts.pointcloud_downscale
    frames = capture.train
    poses, intr = poses_tensor(frames).to(device), intrinsics_tensor(frames).to(device)
    model_name = frames[0].intrinsics.model if frames else "pinhole"
    bg = torch.tensor(capture.eval_background, dtype=torch.float32, device=device)

    def view_rays(v: int) -> tuple[torch.Tensor, torch.Tensor]:
        w, h = frames[v].intrinsics.width, frames[v].intrinsics.height
        iy, ix = torch.meshgrid(
            torch.arange(0, h, k, device=device, dtype=torch.float32),
            torch.arange(0, w, k, device=device, dtype=torch.float32),
            indexing="ij",
        )
        n = ix.numel()
        return pixel_rays(
            poses[v][None].expand(n, 3, 4),
            intr[v][None].expand(n, 10),
            ix.reshape(-1) + 0.5 * k,
            iy.reshape(-1) + 0.5 * k,
            model=model_name,
        )

    def render(o: torch.Tensor, d: torch.Tensor) -> dict[str, torch.Tensor]:
        return model.renderer.render_image(model.field, o, d, bg, chunk=opts.chunk // 4)

    points, colors = render_point_cloud(
        render, (view_rays(v) for v in range(len(frames))), opts.num_points, opts.min_opacity
    )
    if len(points) == 0:
        raise UserError(f"pointcloud: no pixel with opacity > min_opacity={opts.min_opacity}; lower it")
    cloud = trimesh.PointCloud(
        _to_output_space(points, space),
        colors=np.concatenate([colors, np.full((len(colors), 1), 255, np.uint8)], axis=1),
    )
    path = folder / "pointcloud.ply"
    _write_ply(path, cloud)
    print(f"point cloud: {path} ({len(points)} points)")
    return {"pointcloud": str(path), "points": len(points)}


def export(cfg: DictConfig) -> dict[str, Any]:
    """Run the export described by ``cfg`` (see ``conf/export.yaml``); returns export.json's content."""
    opts = check_config(cfg, ExportOptions, (check_bounds,))
    folder = Path(opts.out) if opts.out is not None else Path(cfg.paths.output_dir)
    created = check_out_folder(folder)
    try:
        info = _export_into(cfg, opts, folder)
    except BaseException:
        remove_empty(created)
        raise
    atomic_write_json(Path(cfg.paths.output_dir) / "export.json", info)
    return info


def _export_into(cfg: DictConfig, opts: ExportOptions, folder: Path) -> dict[str, Any]:
    run = load_run(cfg.ckpt)
    device = device_of(str(cfg.accelerator))
    capture = run.load_capture(nested_overrides(cfg.get("data")))
    space = SceneSpace.of(capture) if opts.space == "capture" else None
    model = run.build_model(nested_overrides(cfg.get("model"))).to(device)
    if opts.what == "mesh":
        check_mesh_fits(opts, model, device)
    commit_run_folder()  # every check has passed
    info: dict[str, Any] = {"checkpoint": str(run.path), "step": run.global_step, "space": opts.space}
    with torch.inference_mode(), writing_to("out"):  # a full disk: `out=` says where the files go
        if opts.what == "mesh":
            cameras = np.stack([np.asarray(f.c2w)[:3, 3] for f in capture.train]) if capture.train else None
            info.update(export_mesh(opts, folder, model, space, device, cameras))
        if opts.what == "pointcloud" or opts.pointcloud:
            info.update(export_pointcloud(opts, folder, model, capture, space, device))
    return info


main = hydra_app("export", export, positional="what", stop_on_sigterm=True)

if __name__ == "__main__":
    main()
