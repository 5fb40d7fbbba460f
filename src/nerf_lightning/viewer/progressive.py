"""Images rendered a chunk of rays at a time, so that a render can stop at any chunk (a new camera, the
end of a time budget) and continue later.

:class:`ImageRender` holds one camera's rays and output buffers and renders the next ``n`` rays per
:meth:`ImageRender.advance` (row-major order, so the finished part is a band of whole rows from the
top). The rendering itself is the model's own: ``Renderer.render_image`` on the slice of rays.
:class:`ChunkSizer` picks ``n`` from a running estimate of the render speed so that one chunk takes
about a target time, and :func:`composite` turns the buffers into the picture the browser shows (RGB,
depth through the Turbo colour map, or accumulation), the rows not rendered yet taken from a coarser
render of the same view.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from nerf_lightning.video.camera_paths import PathCamera, camera_rays
from nerf_lightning.video.writer import depth_range, turbo

__all__ = ["OUTPUTS", "ChunkSizer", "ImageRender", "RenderFn", "composite"]

#: rays_o [n, 3], rays_d [n, 3] -> {"rgb" [n, 3], "depth" [n, 1], "opacity" [n, 1]} (``render_image``)
RenderFn = Callable[[Tensor, Tensor], dict[str, Tensor]]
#: what the viewer can show
OUTPUTS = ("rgb", "depth", "accumulation")


class ImageRender:
    """One camera's image, rendered :meth:`advance` by :meth:`advance` (see the module docstring)."""

    def __init__(self, camera: PathCamera, device: torch.device) -> None:
        self.camera = camera
        self.device = device
        self.rays_o, self.rays_d = camera_rays(camera, device)
        n = camera.width * camera.height
        self.rgb = torch.zeros(n, 3, device=device)
        self.depth = torch.zeros(n, device=device)
        self.opacity = torch.zeros(n, device=device)
        self.done_rays = 0
        self.render_s = 0.0  # seconds spent in advance()

    @property
    def n_rays(self) -> int:
        return self.camera.width * self.camera.height

    @property
    def done(self) -> bool:
        return self.done_rays >= self.n_rays

    def advance(self, render: RenderFn, n: int) -> int:
        """Render the next ``n`` rays (fewer at the end); waits for the device. Returns the rays rendered."""
        i = self.done_rays
        j = min(i + max(1, int(n)), self.n_rays)
        if j <= i:
            return 0
        t0 = time.perf_counter()
        out = render(self.rays_o[i:j], self.rays_d[i:j])
        self.rgb[i:j] = out["rgb"].float().clamp(0, 1)
        self.depth[i:j] = out["depth"].float().reshape(-1)
        self.opacity[i:j] = out["opacity"].float().reshape(-1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the chunk's time is what the budget counts
        self.render_s += time.perf_counter() - t0
        self.done_rays = j
        return j - i

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """rgb float32 [H, W, 3], expected depth [H, W] (0 where nothing is hit), opacity [H, W]."""
        h, w = self.camera.height, self.camera.width
        opacity = self.opacity.reshape(h, w)
        depth = torch.where(
            opacity > 1e-3, self.depth.reshape(h, w) / opacity.clamp_min(1e-3), torch.zeros_like(opacity)
        )
        return self.rgb.reshape(h, w, 3).cpu().numpy(), depth.cpu().numpy(), opacity.cpu().numpy()


class ChunkSizer:
    """Rays per chunk so that one chunk takes about ``target_s``, from an exponential average of the
    measured rays/s (starting at ``initial_rays_per_s``), within ``[min_rays, max_rays]``."""

    def __init__(
        self, target_s: float, initial_rays_per_s: float, min_rays: int = 1024, max_rays: int = 1 << 19
    ) -> None:
        self.target_s = float(target_s)
        self.rays_per_s = float(initial_rays_per_s)
        self.min_rays = int(min_rays)
        self.max_rays = int(max_rays)

    def rays_for(self, seconds: float | None = None) -> int:
        """Rays for one chunk of ``target_s``, or of ``seconds`` when that is shorter."""
        s = self.target_s if seconds is None else min(self.target_s, seconds)
        return int(min(self.max_rays, max(self.min_rays, self.rays_per_s * s)))

    def record(self, rays: int, seconds: float) -> None:
        if rays <= 0 or seconds <= 0:
            return
        rate = rays / seconds
        self.rays_per_s = rate if self.rays_per_s <= 0 else 0.7 * self.rays_per_s + 0.3 * rate


def colorize(
    output: str, rgb: np.ndarray, depth: np.ndarray, opacity: np.ndarray, near_far: tuple[float, float]
) -> np.ndarray:
    """uint8 [H, W, 3] picture of one output (``OUTPUTS``)."""
    if output == "rgb":
        return (np.clip(rgb, 0, 1) * 255).round().astype(np.uint8)
    if output == "depth":
        lo, hi = near_far
        return turbo((depth - lo) / max(hi - lo, 1e-9))
    if output == "accumulation":
        grey = (np.clip(opacity, 0, 1) * 255).round().astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)
    raise ValueError(f"viewer output {output!r}: expected one of {', '.join(OUTPUTS)}")


def composite(
    output: str, image: ImageRender, coarse: ImageRender | None, near_far: tuple[float, float] | None
) -> tuple[np.ndarray, tuple[float, float]]:
    """The picture of ``image`` (uint8 [H, W, 3]): its rendered rows, and below them ``coarse`` (a finished
    render of the same view at a lower resolution) scaled up. Returns it with the depth colour map's
    near/far (``near_far``, or the opaque pixels' range of what is rendered when None)."""
    rgb, depth, opacity = image.arrays()
    h, w = rgb.shape[:2]
    rows = image.done_rays // w
    if rows < h and coarse is not None:
        c_rgb, c_depth, c_opacity = coarse.arrays()
        iy = np.minimum((np.arange(h) + 0.5) * c_rgb.shape[0] / h, c_rgb.shape[0] - 1).astype(int)
        ix = np.minimum((np.arange(w) + 0.5) * c_rgb.shape[1] / w, c_rgb.shape[1] - 1).astype(int)
        grid = np.ix_(iy[rows:], ix)
        rgb[rows:], depth[rows:], opacity[rows:] = c_rgb[grid], c_depth[grid], c_opacity[grid]
    if near_far is None:
        near_far = depth_range(depth, opacity)
    return colorize(output, rgb, depth, opacity, near_far), near_far
