"""A viewer server without a trained model, for tests of its connections: four cameras around the unit
cube, and a field that renders noise (incompressible: every frame is a full-size JPEG), cheaply."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.viewer.scene import SceneInfo
from nerf_lightning.viewer.server import ViewerServer

CENTRE = np.array([0.5, 0.5, 0.5])


def ring_info(n: int = 4) -> SceneInfo:
    """``n`` cameras on a ring around the unit cube's centre, looking at it (OpenCV c2w, NGP space)."""
    poses = []
    for angle in np.linspace(0, 2 * np.pi, n, endpoint=False):
        position = CENTRE + np.array([np.cos(angle), np.sin(angle), 0.0])
        forward = (CENTRE - position) / np.linalg.norm(CENTRE - position)
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        c2w = np.eye(4)
        c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(forward, right), forward, position
        poses.append(c2w)
    return SceneInfo(
        poses=np.stack(poses),
        fov_y=np.full(n, 0.8),
        aspect=np.full(n, 4 / 3),
        sizes=[(64, 48)] * n,
        names=[f"view{i}" for i in range(n)],
        aabb_scale=1,
        background=(1.0, 1.0, 1.0),
        space=SceneSpace(1.0, (0.5, 0.5, 0.5), np.eye(4)),
    )


class NoiseSource:
    """A :class:`~nerf_lightning.viewer.server.RenderSource` stand-in: random colours, unit opacity."""

    device = torch.device("cpu")
    renderer: Any = None  # no occupancy grid: the cells toggle stays off

    def __init__(self) -> None:
        self.rays = 0

    def render(self, rays_o: torch.Tensor, rays_d: torch.Tensor) -> dict[str, torch.Tensor]:
        n = rays_o.shape[0]
        self.rays += n
        return {"rgb": torch.rand(n, 3), "depth": torch.rand(n), "opacity": torch.ones(n)}


def noise_server(**kwargs: Any) -> ViewerServer:
    """A listening viewer on the ring with the noise field (any free port unless ``port=``)."""
    kwargs.setdefault("port", 0)
    kwargs.setdefault("max_size", 64)
    kwargs.setdefault("preview_size", 16)
    return ViewerServer(ring_info(), NoiseSource(), **kwargs)
