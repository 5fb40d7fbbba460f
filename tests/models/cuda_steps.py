"""A budgeted training step with learned pose corrections and exposures on the GPU, and its optimizer: what
the GPU tests of graphed steps train (``test_view_corrections_cuda.py``, ``test_update_graph_cuda.py``)."""

from __future__ import annotations

import torch

from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.loss import StepLoss
from nerf_lightning.models.train_step import TrainStep
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer

DEV = torch.device("cuda")
N_VIEWS = 12


def step_with_views(seed: int = 0):
    """``(step, camera_opt, exposure, fused Adam of three groups, (rays_o, rays_d, target, background,
    view_ids))``: 4096 rays from 12 views into the unit cube, the corrections already away from zero."""
    torch.manual_seed(seed)
    field = NGPField(aabb_scale=1, density_bias=1.0).to(DEV)
    with torch.no_grad():
        field.encoding.params.uniform_(-0.5, 0.5)
    grid = OccupancyGrid(aabb_scale=1, resolution=64).to(DEV)
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    centres = (
        torch.nn.functional.normalize(torch.randn(N_VIEWS, 3, device=DEV, generator=g), dim=-1) * 1.5 + 0.5
    )
    poses = torch.cat([torch.eye(3, device=DEV).expand(N_VIEWS, 3, 3), centres[:, :, None]], dim=-1)
    view_ids = torch.randint(0, N_VIEWS, (4096,), device=DEV, generator=g)
    o = centres[view_ids].contiguous()
    target_pts = 0.5 + (torch.rand(4096, 3, device=DEV, generator=g) - 0.5) * 0.8
    d = torch.nn.functional.normalize(target_pts - o, dim=-1).contiguous()
    bg = torch.rand(4096, 3, device=DEV, generator=g)
    target = torch.rand(4096, 3, device=DEV, generator=g)
    cam = CameraOptimizer(N_VIEWS, poses.cpu(), enabled=True).to(DEV)
    exposure = PerViewExposure(N_VIEWS, enabled=True, bias=True).to(DEV)
    with torch.no_grad():  # corrections already away from zero: every term of their gradient is live
        cam.adjustment.normal_(0.0, 0.01, generator=g)
        exposure.log_gain.normal_(0.0, 0.1, generator=g)
        exposure.offset.normal_(0.0, 0.01, generator=g)
    step = TrainStep(
        field, Renderer(grid, backend="cuda"), StepLoss("huber", 0.1), sample_budget=1 << 16,
        march_budget=1 << 18,
        n_rays_init=2048, jitter=False, camera_opt=cam, appearance=exposure,
    ).to(DEV)  # fmt: skip
    groups = [
        {"params": list(field.parameters())},
        {"params": [cam.adjustment], "lr": 1e-3},
        {"params": [exposure.log_gain, exposure.offset]},
    ]
    opt = torch.optim.Adam(groups, lr=1e-2, eps=1e-15, fused=True)
    return step, cam, exposure, opt, (o, d, target, bg, view_ids)
