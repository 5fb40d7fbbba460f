"""Hydra app: export the geometry of a trained checkpoint as PLY files.

    python -m nerf_lightning.export mesh ckpt=PATH [resolution=256] [threshold=10] [pointcloud=true]
    python -m nerf_lightning.export pointcloud ckpt=PATH [num_points=1000000]

``mesh``: ``mesh.ply``, marching cubes over the density inside the occupancy grid's occupied cells,
with per-vertex colours (``mesh/extract.py``). ``pointcloud`` (or ``mesh ... pointcloud=true``):
``pointcloud.ply``, points at the expected depth of the training views' opaque pixels with their
rendered colours. Coordinates are in the capture's own world frame (that of its ``transforms.json``,
so the geometry lines up with the cameras and other tools) or, with ``space=ngp``, in NGP space.
Files go into the run folder (``outputs/runs/export/<date>_<time>/`` unless ``hydra.run.dir=...``),
written atomically. See ``conf/export.yaml`` for every option.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from omegaconf import DictConfig

from nerf_lightning.apps.config_checks import check_bounds, check_config
from nerf_lightning.apps.entry import device_of, hydra_app, nested_overrides
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.data.cameras import intrinsics_tensor, pixel_rays, poses_tensor
from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.errors import UserError
from nerf_lightning.mesh.extract import extract_mesh, render_point_cloud
from nerf_lightning.run.restore import load_run
from nerf_lightning.utils.io import atomic_write_bytes, atomic_write_json

log = logging.getLogger("nerf_lightning.export")


@dataclass(frozen=True)
class ExportOptions:
    """The export's own keys (``conf/export.yaml``, where each is described)."""

    what: Literal["mesh", "pointcloud"]
    space: Literal["capture", "ngp"]
    resolution: Annotated[int, Range(low=1), Note("grid cells along the longest side")]
    threshold: float
    bounds: list[float] | None  # checked by check_bounds
    chunk: Annotated[int, Range(low=1)]
    pointcloud: bool
    num_points: Annotated[int, Range(low=1)]
    pointcloud_downscale: Annotated[int, Range(low=1)]
    min_opacity: Annotated[float, Range(low=0, high=1)]


def _write_ply(path: Path, geometry: Any) -> None:
    data = geometry.export(file_type="ply")  # binary PLY with vertex colours
    atomic_write_bytes(path, data if isinstance(data, bytes) else io.BytesIO(data).getvalue())


def _to_output_space(points: np.ndarray, space: SceneSpace | None) -> np.ndarray:
    return points if space is None else space.points_to_capture(points)


def export_mesh(
    opts: ExportOptions, out_dir: Path, model: Any, space: SceneSpace | None, device: torch.device
) -> dict[str, Any]:
    import trimesh

    bounds = opts.bounds
    try:
        mesh = extract_mesh(
            model.field,
            model.field.density,
            model.occupancy,
            resolution=opts.resolution,
            threshold=float(opts.threshold),
            bounds=bounds,
            chunk=opts.chunk,
            device=device,
        )
    except ValueError as err:
        raise UserError(f"export mesh (threshold={opts.threshold}, bounds={bounds}): {err}") from err
    tm = trimesh.Trimesh(
        vertices=_to_output_space(mesh.vertices, space),
        faces=mesh.faces,
        vertex_colors=np.concatenate([mesh.colors, np.full((len(mesh.colors), 1), 255, np.uint8)], axis=1),
        process=False,
    )
    path = out_dir / "mesh.ply"
    _write_ply(path, tm)
    print(f"mesh: {path} ({len(tm.vertices)} vertices, {len(tm.faces)} faces)")
    return {
        "mesh": str(path),
        "vertices": len(tm.vertices),
        "faces": len(tm.faces),
        "watertight": bool(tm.is_watertight),
    }


def export_pointcloud(
    opts: ExportOptions,
    out_dir: Path,
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
        render, (view_rays(v) for v in range(len(frames))), opts.num_points, float(opts.min_opacity)
    )
    if len(points) == 0:
        raise UserError(f"pointcloud: no pixel with opacity > min_opacity={opts.min_opacity}; lower it")
    cloud = trimesh.PointCloud(
        _to_output_space(points, space),
        colors=np.concatenate([colors, np.full((len(colors), 1), 255, np.uint8)], axis=1),
    )
    path = out_dir / "pointcloud.ply"
    _write_ply(path, cloud)
    print(f"point cloud: {path} ({len(points)} points)")
    return {"pointcloud": str(path), "points": len(points)}


def export(cfg: DictConfig) -> dict[str, Any]:
    """Run the export described by ``cfg`` (see ``conf/export.yaml``); returns export.json's content."""
    opts = check_config(cfg, ExportOptions, (check_bounds,))
    out_dir = Path(cfg.paths.output_dir)
    run = load_run(cfg.ckpt)
    device = device_of(str(cfg.accelerator))
    capture = run.load_capture(nested_overrides(cfg.get("data")))
    space = SceneSpace.of(capture) if opts.space == "capture" else None
    model = run.build_model(nested_overrides(cfg.get("model"))).to(device)
    info: dict[str, Any] = {"checkpoint": str(run.path), "step": run.global_step, "space": opts.space}
    with torch.inference_mode():
        if opts.what == "mesh":
            info.update(export_mesh(opts, out_dir, model, space, device))
        if opts.what == "pointcloud" or opts.pointcloud:
            info.update(export_pointcloud(opts, out_dir, model, capture, space, device))
    atomic_write_json(out_dir / "export.json", info)
    return info


main = hydra_app("export", export, positional="what", stop_on_sigterm=True)

if __name__ == "__main__":
    main()
