"""Hydra app: render a trained checkpoint along a camera path into MP4 videos.

    python -m nerf_lightning.render ckpt=PATH camera_path=orbit|spiral|FILE frames=120 fps=30

Writes into
its run folder (``outputs/runs/render/<date>_<time>/`` unless ``hydra.run.dir=...``): ``rgb.mp4``,
``depth.mp4`` (expected depth through the Turbo colour map, one depth range for the whole video so
that it does not flicker), optionally ``frames/rgb_NNNN.png`` (built in a hidden ``.frames.tmp-*``; one
that a render killed with SIGKILL left is removed by the next render into the folder), and
``render.json`` (frames, size, render time and frames/s — rendering only, excluding the video
encoding). Each frame is rendered
``chunk`` rays at a time (``Renderer.render_image``), so memory stays bounded at any resolution;
a rich progress bar shows the frames. See ``video/camera_paths.py`` for the paths and
``conf/render.yaml`` for every option.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from omegaconf import DictConfig

from nerf_lightning.apps.config_checks import check_background, check_config
from nerf_lightning.apps.entry import device_of, hydra_app, nested_overrides
from nerf_lightning.capture.build_folder import building, remove_stale_builds
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.data.types import Capture
from nerf_lightning.errors import UserError
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.run.restore import load_run
from nerf_lightning.utils.io import atomic_directory, atomic_write_json
from nerf_lightning.utils.memory import check_fits
from nerf_lightning.video import writer
from nerf_lightning.video.camera_paths import PathCamera, camera_rays, orbit_path, read_nerfstudio_path
from nerf_lightning.video.writer import VideoWriter, turbo

log = logging.getLogger("nerf_lightning.render")

#: bytes per pixel that a frame holds at once on the render device (``render_video``'s loop): the rays'
#: directions (12; their origins are the camera centre, broadcast), the rendered colour, opacity and
#: depth (20), the colour clamped, scaled and rounded (12 + 12 + 12), as 8 bits (3), the depth (4)
DEVICE_BYTES_PER_PIXEL = 75
#: bytes per pixel on the host beside them: the 8-bit frame (3), the depth and opacity read back (8)
HOST_BYTES_PER_PIXEL = 11
#: and for ``depth.mp4`` the depth's Turbo colours (``video/writer.turbo``): the depth scaled (4), at
#: float64 (8), its six powers (48) and those stacked (48)
DEPTH_BYTES_PER_PIXEL = 108

#: orbit/spiral image size
_Side = Annotated[int | None, Range(low=1), Note("null: the first training view's")]


@dataclass(frozen=True)
class RenderOptions:
    """The render's own keys (``conf/render.yaml``, where each is described)."""

    camera_path: str
    camera_path_space: Literal["capture", "ngp"]
    frames: Annotated[int, Range(low=1)]
    fps: Annotated[float | None, Range(above=0), Note("null: a file's own, else 30")]
    width: _Side
    height: _Side
    fov: Annotated[float | None, Range(above=0, below=180), Note("vertical, degrees")]
    spiral_height: float
    chunk: Annotated[int, Range(low=1)]
    depth: bool
    save_frames: bool
    quality: Annotated[int, Range(low=0, high=10)]
    background: list[float] | None  # checked by check_background


def path_cameras(opts: RenderOptions, capture: Capture) -> tuple[list[PathCamera], float | None]:
    """The cameras of ``opts.camera_path`` (and a file's own fps)."""
    kind = str(opts.camera_path)
    if kind in ("orbit", "spiral"):
        if not capture.train:
            raise UserError(f"{capture.root}: no training views to place an {kind} around")
        f0 = capture.train[0].intrinsics
        width = int(opts.width or (round(opts.height * f0.width / f0.height) if opts.height else f0.width))
        height = int(opts.height or round(width * f0.height / f0.width))
        fov = math.radians(float(opts.fov)) if opts.fov else 2 * math.atan(0.5 * f0.height / f0.fy)
        fy = 0.5 * height / math.tan(fov / 2)
        c2w = np.stack([np.asarray(f.c2w) for f in capture.train])
        cams = orbit_path(
            c2w, opts.frames, width, height, fy * f0.fx / f0.fy, fy, kind, float(opts.spiral_height)
        )
        return cams, None
    space = SceneSpace.of(capture) if opts.camera_path_space == "capture" else None
    return read_nerfstudio_path(kind, space)


def check_frame_fits(opts: RenderOptions, cams: list[PathCamera], device: torch.device) -> None:
    """The largest frame's buffers (``*_BYTES_PER_PIXEL``) fit in the memory available, before any is
    allocated; rendering itself goes ``chunk`` rays at a time (its working memory is not counted)."""
    cam = max(cams, key=lambda c: c.width * c.height)
    pixels = cam.width * cam.height
    host = pixels * (HOST_BYTES_PER_PIXEL + (DEPTH_BYTES_PER_PIXEL if opts.depth else 0))
    keys = (
        f"width={opts.width} height={opts.height}"
        if opts.camera_path in ("orbit", "spiral")
        else (f"camera_path={opts.camera_path} (render_width={cam.width}, render_height={cam.height})")
    )
    check_fits(
        f"render {keys}: a {cam.width}x{cam.height} frame",
        device,
        pixels * DEVICE_BYTES_PER_PIXEL,
        host,
        "render a smaller frame",
    )


def render_video(cfg: DictConfig) -> dict[str, Any]:
    """Render the video described by ``cfg`` (see ``conf/render.yaml``); returns render.json's content."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    opts = check_config(cfg, RenderOptions, (check_background,))
    out_dir = Path(cfg.paths.output_dir)
    run = load_run(cfg.ckpt)
    device = device_of(str(cfg.accelerator))
    capture = run.load_capture(nested_overrides(cfg.get("data")))
    cams, file_fps = path_cameras(opts, capture)
    check_frame_fits(opts, cams, device)
    fps = float(opts.fps or file_fps or 30)
    model = run.build_model(nested_overrides(cfg.get("model"))).to(device)
    bg = torch.tensor(
        opts.background if opts.background is not None else list(capture.eval_background),
        dtype=torch.float32,
        device=device,
    )
    log.info(
        "rendering %d frames %dx%d from %s (step %d) on %s",
        len(cams),
        cams[0].width,
        cams[0].height,
        run.path,
        run.global_step,
        device,
    )

    commit_run_folder()  # every check has passed
    depth_range: tuple[float, float] | None = None
    render_s = 0.0
    start = time.perf_counter()
    rgb_video = VideoWriter(out_dir / "rgb.mp4", fps, opts.quality)
    depth_video = VideoWriter(out_dir / "depth.mp4", fps, opts.quality) if opts.depth else None
    columns = (TextColumn("render"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    try:
        with contextlib.ExitStack() as stack:
            # the frames are built aside and go into place once all are written (an interrupted render
            # leaves none)
            frames = None
            if opts.save_frames:
                remove_stale_builds(out_dir / "frames")  # what a render killed here (kill -9) left
                frames = stack.enter_context(atomic_directory(out_dir / "frames", overwrite=True))
                stack.enter_context(building(frames))
            progress = stack.enter_context(Progress(*columns, transient=False))
            stack.enter_context(torch.inference_mode())
            task = progress.add_task("frames", total=len(cams))
            for i, cam in enumerate(cams):
                t0 = time.perf_counter()
                rays_o, rays_d = camera_rays(cam, device)
                out = model.renderer.render_image(model.field, rays_o, rays_d, bg, chunk=opts.chunk)
                rgb = out["rgb"].reshape(cam.height, cam.width, 3).clamp(0, 1)
                opacity = out["opacity"].reshape(cam.height, cam.width)
                depth = torch.where(
                    opacity > 1e-3,
                    out["depth"].reshape(cam.height, cam.width) / opacity.clamp_min(1e-3),
                    torch.zeros_like(opacity),
                )
                rgb8 = (rgb * 255).round().to(torch.uint8).cpu().numpy()  # waits for the device
                depth_np = depth.float().cpu().numpy()
                render_s += time.perf_counter() - t0
                rgb_video.append(rgb8)
                if depth_video is not None:
                    if depth_range is None:
                        depth_range = writer.depth_range(depth_np, opacity.cpu().numpy())
                    lo, hi = depth_range
                    depth_video.append(turbo((depth_np - lo) / (hi - lo)))
                if frames is not None:
                    import imageio.v3 as iio

                    iio.imwrite(frames / f"rgb_{i:04d}.png", rgb8)
                progress.advance(task)
        rgb_video.close()
        if depth_video is not None:
            depth_video.close()
    except BaseException:
        rgb_video.abort()
        if depth_video is not None:
            depth_video.abort()
        raise
    total_s = time.perf_counter() - start
    info: dict[str, Any] = {
        "checkpoint": str(run.path),
        "step": run.global_step,
        "camera_path": str(opts.camera_path),
        "frames": len(cams),
        "width": cams[0].width,
        "height": cams[0].height,
        "fps": fps,
        "device": str(device),
        "render_s": render_s,
        "render_fps": len(cams) / render_s if render_s > 0 else float("nan"),
        "total_s": total_s,
        "videos": ["rgb.mp4"] + (["depth.mp4"] if depth_video is not None else []),
        "depth_range": list(depth_range) if depth_range else None,
    }
    atomic_write_json(out_dir / "render.json", info)
    print(
        f"rendered {len(cams)} frames {cams[0].width}x{cams[0].height} in {render_s:.1f} s "
        f"({info['render_fps']:.2f} frames/s, {device}); video dir: {out_dir}"
    )
    return info


main = hydra_app("render", render_video, stop_on_sigterm=True)

if __name__ == "__main__":
    main()
