"""Renderer: rays -> packed samples (occupancy-skipping march) -> field -> composited outputs.

Field protocol (``models/field.py`` implements it)::

    field(positions float32 [S, 3], directions float32 [S, 3]) -> (sigmas [S], rgbs [S, 3])
    field.density(positions float32 [S, 3]) -> sigmas [S]

Positions are NGP-space sample midpoints; directions are the (unit) ray directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..ops import get_ops
from .gradient_scaling import scale_near_gradients
from .occupancy import OccupancyGrid

__all__ = [
    "LARGE_SCENE_CONE_ANGLE",
    "Renderer",
    "build_renderer",
    "fixed_render_counts",
    "opacity_error",
    "ray_distortion",
]

#: instant-ngp's cone angle for scenes larger than the unit cube (``aabb_scale > 1``)
LARGE_SCENE_CONE_ANGLE = 1.0 / 256


def build_renderer(
    aabb_scale: int = 1,
    occupancy: Callable[..., OccupancyGrid] = OccupancyGrid,
    cone_angle: float | None = None,
    large_scene_cone_angle: float = LARGE_SCENE_CONE_ANGLE,
    **kwargs: Any,
) -> Renderer:
    """The renderer of a scene whose outer box is ``aabb_scale`` (the ``model.renderer`` config node).

    Args:
        aabb_scale: the capture's outer box (``NeRFModule`` passes it).
        occupancy: factory of the occupancy grid (``model.renderer.occupancy``), called with
            ``aabb_scale``.
        cone_angle: the marching step grows as ``t * cone_angle``. None follows instant-ngp:
            ``large_scene_cone_angle`` when ``aabb_scale > 1`` (real captures with background), else 0.
        kwargs: the other :class:`Renderer` arguments (``step_size``, ``near_plane``, ...).
    """
    if cone_angle is None:
        cone_angle = large_scene_cone_angle if aabb_scale > 1 else 0.0
    return Renderer(occupancy(aabb_scale=aabb_scale), cone_angle=cone_angle, **kwargs)


class Renderer(nn.Module):
    """Volume renderer over an :class:`OccupancyGrid` (held as a submodule, so its buffers follow
    ``.to()`` and the state dict).

    Args:
        occupancy: the occupancy grid (gives the outer box and the cells to march through).
        step_size: minimum marching step (instant-ngp: sqrt(3)/1024).
        cone_angle: step grows as ``t * cone_angle`` (0: uniform; instant-ngp uses 1/256 for
            large scenes).
        max_samples_per_ray: cap on kept samples per ray.
        near_plane: samples start at ``t >= near_plane``.
        early_stop_eps: transmittance under which samples get weight 0.
        ops_backend: ``"auto"``, ``"cuda"`` or ``"torch"`` (see ``nerf_lightning.ops.get_ops``).
        compact_samples: when gradients are on, first evaluate densities without gradients, drop the
            samples behind the early-termination point (transmittance < ``early_stop_eps``; their
            weight is exactly 0) and run the differentiable pass on the rest only, as instant-ngp's
            training kernels do. Same outputs and gradients; far less work behind opaque surfaces.
        gradient_scaling_distance: when gradients are on, scale each sample's density and colour
            gradient by ``min(1, (t / distance)^2)`` (``volume/gradient_scaling.py``); None: off.
    """

    def __init__(
        self,
        occupancy: OccupancyGrid,
        *,
        step_size: float = math.sqrt(3.0) / 1024,
        cone_angle: float = 0.0,
        max_samples_per_ray: int = 1024,
        near_plane: float = 0.0,
        early_stop_eps: float = 1e-4,
        ops_backend: str = "auto",
        compact_samples: bool = True,
        gradient_scaling_distance: float | None = None,
    ) -> None:
        super().__init__()
        self.occupancy = occupancy
        self.step_size = float(step_size)
        self.cone_angle = float(cone_angle)
        self.max_samples_per_ray = int(max_samples_per_ray)
        self.near_plane = float(near_plane)
        self.early_stop_eps = float(early_stop_eps)
        self.compact_samples = bool(compact_samples)
        if gradient_scaling_distance is not None and gradient_scaling_distance <= 0:
            raise ValueError(
                "model.renderer.gradient_scaling_distance must be > 0 (NGP units) or null (off), "
                f"got {gradient_scaling_distance}"
            )
        self.gradient_scaling_distance = gradient_scaling_distance
        # Keep the name, not the namespace: modules cannot be deep-copied/pickled with the renderer.
        self.ops_backend = ops_backend
        get_ops(ops_backend)  # validate the name now (and log, once, what it resolves to)

    @property
    def ops(self) -> Any:
        """The ops namespace of ``ops_backend``."""
        return get_ops(self.ops_backend)

    def render_rays(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        background: Tensor | None,
        *,
        jitter: bool,
    ) -> dict[str, Tensor]:
        """Render a batch of rays.

        Args:
            field: see the module docstring.
            rays_o: float32 [R, 3] NGP-space origins.
            rays_d: float32 [R, 3] unit directions.
            background: float32 [R, 3], [3] or None (black).
            jitter: shift each ray's first sample by a uniform fraction of a step (training).

        Returns:
            dict with
              ``rgb`` float32 [R, 3], ``opacity`` [R, 1], ``depth`` [R, 1] (weighted sum of sample
              midpoints, not normalized by opacity), ``n_samples`` int64 scalar tensor (kept
              samples, on device: no host sync), and the packed samples for losses:
              ``weights`` [S], ``sigmas`` [S], ``ray_indices`` int64 [S], ``t_starts`` [S],
              ``t_ends`` [S], ``packed_info`` int64 [R, 2].
        """
        ops = self.ops
        n_rays = rays_o.shape[0]
        with torch.no_grad():
            t_near, t_far, _ = ops.ray_aabb_intersect(rays_o, rays_d, self.occupancy.aabb)
            t_jitter = torch.rand(n_rays, device=rays_o.device) if jitter else None
            packed = ops.march_rays(
                rays_o,
                rays_d,
                t_near,
                t_far,
                self.occupancy.binaries,
                step_size=self.step_size,
                cone_angle=self.cone_angle,
                max_samples_per_ray=self.max_samples_per_ray,
                near_plane=self.near_plane,
                t_jitter=t_jitter,
            )
        ray_indices, t_starts, t_ends, packed_info = packed
        n_marched = packed_info[:, 1].sum()
        if self.compact_samples and torch.is_grad_enabled() and t_starts.shape[0] > 0:
            ray_indices, t_starts, t_ends, packed_info = self._drop_terminated(
                field, rays_o, rays_d, ray_indices, t_starts, t_ends, packed_info
            )
        if t_starts.shape[0] > 0:
            positions, dirs = ops.sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
            sigmas, rgbs = field(positions, dirs)
            sigmas, rgbs = self._scale_gradients(sigmas.reshape(-1), rgbs.reshape(-1, 3), t_starts, t_ends)
            connect = None
        else:
            # No samples at all: skip the field (empty batches break some encodings), but keep the
            # outputs connected to its parameters (zero gradient) so backward/DDP see a graph.
            sigmas = torch.zeros(0, device=rays_o.device)
            rgbs = torch.zeros(0, 3, device=rays_o.device)
            connect = None
            if torch.is_grad_enabled():
                dummy_p = torch.full((1, 3), 0.5, device=rays_o.device)
                dummy_d = torch.tensor([[0.0, 0.0, 1.0]], device=rays_o.device)
                s0, c0 = field(dummy_p, dummy_d)
                connect = (s0.sum() + c0.sum()) * 0.0
        out = ops.volume_render(
            sigmas,
            rgbs,
            t_starts,
            t_ends,
            ray_indices,
            n_rays,
            packed_info=packed_info,
            background=background,
            early_stop_eps=self.early_stop_eps,
        )
        if connect is not None:
            out["rgb"] = out["rgb"] + connect
        out.update(
            n_samples=n_marched,
            n_samples_rendered=packed_info[:, 1].sum(),
            sigmas=sigmas,
            ray_indices=ray_indices,
            t_starts=t_starts,
            t_ends=t_ends,
            packed_info=packed_info,
        )
        return out

    def render_rays_fixed(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        background: Tensor | None,
        *,
        march_capacity: int,
        sample_capacity: int,
        n_active: Tensor | None = None,
        jitter: bool = True,
    ) -> dict[str, Tensor]:
        """Render a batch of rays with static shapes: a fixed sample budget, no host synchronization.

        The training path of instant-ngp and nerfacc, with shapes that never depend on data (so the
        step can be captured in a CUDA graph):

        1. march rays ``0 .. n_active - 1`` into ``march_capacity`` sample slots
           (``ops.march_rays_fixed``; rays that do not fit are dropped, in index order);
        2. if ``compact_samples``: densities without gradients on all slots, then keep only samples
           before the early-termination point (their weight is exactly 0 otherwise);
        3. repack the kept samples into ``sample_capacity`` slots (``ops.repack``; rays that do not fit
           are dropped) and run the differentiable field and compositing on those slots.

        Dropped rays have ``ray_valid`` False and must be left out of the loss; the padding slots
        of the fixed layout have zero length, so they add nothing to outputs or gradients.

        Args:
            field, rays_o, rays_d, background: as :meth:`render_rays`.
            march_capacity: sample slots of the marching pass (>= 1).
            sample_capacity: sample slots of the differentiable pass (>= 1).
            n_active: int64 scalar tensor, rays to march (None: all).
            jitter: shift each ray's first sample by a uniform fraction of a step.

        Returns:
            dict with ``rgb`` [R, 3], ``opacity`` [R, 1], ``depth`` [R, 1], ``ray_valid`` bool [R],
            ``marched_counts`` int64 [R] (samples each ray got in the marching pass; count only the
            valid rays), the fixed-layout samples ``weights`` / ``sigmas`` / ``ray_indices`` /
            ``t_starts`` / ``t_ends`` [sample_capacity] and ``packed_info`` [R, 2] (its counts are the
            samples in the differentiable pass). No scalar sums: the training step reduces the
            counts in its own kernel; :func:`fixed_render_counts` gives them otherwise.
        """
        if march_capacity < 1 or sample_capacity < 1:
            raise ValueError(
                f"render_rays_fixed: capacities must be >= 1, got {march_capacity}, {sample_capacity}"
            )
        ops = self.ops
        n_rays = rays_o.shape[0]
        with torch.no_grad():
            t_near, t_far, _ = ops.ray_aabb_intersect(rays_o, rays_d, self.occupancy.aabb)
            t_jitter = torch.rand(n_rays, device=rays_o.device) if jitter else None
            marched, valid = ops.march_rays_fixed(
                rays_o,
                rays_d,
                t_near,
                t_far,
                self.occupancy.binaries,
                capacity=march_capacity,
                n_active=n_active,
                step_size=self.step_size,
                cone_angle=self.cone_angle,
                max_samples_per_ray=self.max_samples_per_ray,
                near_plane=self.near_plane,
                t_jitter=t_jitter,
            )
            if self.compact_samples:
                positions, _ = ops.sample_points(rays_o, rays_d, *marched[:3])
                sigmas = field.density(positions).reshape(-1).float()
                _, transmittance = ops.render_weights(
                    sigmas,
                    marched.t_starts,
                    marched.t_ends,
                    marched.ray_indices,
                    n_rays,
                    packed_info=marched.packed_info,
                    early_stop_eps=self.early_stop_eps,
                )
                keep = transmittance >= self.early_stop_eps
            else:
                keep = torch.ones_like(marched.ray_indices, dtype=torch.bool)
            packed, valid = ops.repack(marched, keep, sample_capacity, valid)
        positions, dirs = ops.sample_points(rays_o, rays_d, *packed[:3])
        sigmas, rgbs = field(positions, dirs)
        sigmas, rgbs = self._scale_gradients(
            sigmas.reshape(-1), rgbs.reshape(-1, 3), packed.t_starts, packed.t_ends
        )
        out = ops.volume_render(
            sigmas,
            rgbs,
            packed.t_starts,
            packed.t_ends,
            packed.ray_indices,
            n_rays,
            packed_info=packed.packed_info,
            background=background,
            early_stop_eps=self.early_stop_eps,
        )
        out.update(
            ray_valid=valid,
            marched_counts=marched.packed_info[:, 1],
            sigmas=sigmas,
            ray_indices=packed.ray_indices,
            t_starts=packed.t_starts,
            t_ends=packed.t_ends,
            packed_info=packed.packed_info,
        )
        return out

    def _scale_gradients(
        self, sigmas: Tensor, rgbs: Tensor, t_starts: Tensor, t_ends: Tensor
    ) -> tuple[Tensor, Tensor]:
        if self.gradient_scaling_distance is None or not torch.is_grad_enabled():
            return sigmas, rgbs
        return scale_near_gradients(sigmas, rgbs, t_starts, t_ends, self.gradient_scaling_distance)

    @torch.no_grad()
    def _drop_terminated(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        ray_indices: Tensor,
        t_starts: Tensor,
        t_ends: Tensor,
        packed_info: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Packed samples whose transmittance is still >= ``early_stop_eps`` under the current field."""
        n_rays = rays_o.shape[0]
        positions, _ = self.ops.sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
        sigmas = field.density(positions).reshape(-1).float()
        _, transmittance = self.ops.render_weights(
            sigmas,
            t_starts,
            t_ends,
            ray_indices,
            n_rays,
            packed_info=packed_info,
            early_stop_eps=self.early_stop_eps,
        )
        keep = transmittance >= self.early_stop_eps
        ray_indices, t_starts, t_ends = ray_indices[keep], t_starts[keep], t_ends[keep]
        # index_add_ rather than bincount: no device->host sync to size the output.
        counts = torch.zeros(n_rays, dtype=torch.int64, device=ray_indices.device)
        counts.index_add_(0, ray_indices, torch.ones_like(ray_indices))
        starts = torch.cumsum(counts, 0) - counts
        return ray_indices, t_starts, t_ends, torch.stack([starts, counts], dim=-1).to(packed_info.dtype)

    @torch.no_grad()
    def render_image(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        background: Tensor | None,
        chunk: int = 2**14,
    ) -> dict[str, Tensor]:
        """Render many rays (e.g. an image's H*W) without gradients, ``chunk`` rays at a time.

        Args:
            field: see the module docstring.
            rays_o: float32 [N, 3].
            rays_d: float32 [N, 3].
            background: float32 [N, 3], [3] or None.
            chunk: rays per ``render_rays`` call.

        Returns:
            dict with ``rgb`` [N, 3], ``opacity`` [N, 1], ``depth`` [N, 1] and ``n_samples`` (int64
            scalar tensor, total over all chunks).
        """
        n = rays_o.shape[0]
        per_ray = background is not None and background.dim() == 2
        if per_ray and background.shape != (n, 3):
            raise ValueError(
                f"render_image: background must be [3] or [{n}, 3], got {tuple(background.shape)}"
            )
        keys = ("rgb", "opacity", "depth")
        parts: dict[str, list[Tensor]] = {k: [] for k in keys}
        n_samples = torch.zeros((), dtype=torch.long, device=rays_o.device)
        for i in range(0, n, chunk):
            bg = background[i : i + chunk] if per_ray else background
            out = self.render_rays(field, rays_o[i : i + chunk], rays_d[i : i + chunk], bg, jitter=False)
            for k in keys:
                parts[k].append(out[k])
            n_samples = n_samples + out["n_samples"]
        if n == 0:
            dims = {"rgb": 3, "opacity": 1, "depth": 1}
            return {**{k: rays_o.new_zeros(0, d) for k, d in dims.items()}, "n_samples": n_samples}
        return {**{k: torch.cat(v) for k, v in parts.items()}, "n_samples": n_samples}


def ray_distortion(out: dict[str, Tensor], ops: Any | None = None) -> Tensor:
    """Distortion loss [R] of a :meth:`Renderer.render_rays` / ``render_rays_fixed`` result
    (``ops.distortion_loss`` over its packed samples), differentiable.

    Args:
        out: the render result.
        ops: the ops namespace to run it with, the renderer's (``Renderer.ops``) in training, so
            that CUDA tensors get the kernel (``ops.cuda.distortion_loss``); None: ``get_ops("auto")``.
    """
    ops = get_ops("auto") if ops is None else ops
    return ops.distortion_loss(
        out["weights"], out["t_starts"], out["t_ends"], out["ray_indices"], out["packed_info"]
    )


def opacity_error(out: dict[str, Tensor], alpha: Tensor) -> Tensor:
    """Squared error [R] of a render result's opacity against the target ``alpha`` [R] (the opacity
    loss of ``model.alpha_weight``), differentiable."""
    return (out["opacity"].reshape(-1) - alpha).square()


def fixed_render_counts(out: dict[str, Tensor]) -> dict[str, Tensor]:
    """int64 scalar tensors of a :meth:`Renderer.render_rays_fixed` result: ``n_rays`` (valid rays),
    ``n_samples`` (marched samples of the valid rays), ``n_samples_rendered`` (samples in the
    differentiable pass)."""
    valid = out["ray_valid"]
    return {
        "n_rays": valid.sum(),
        "n_samples": (out["marched_counts"] * valid).sum(),
        "n_samples_rendered": out["packed_info"][:, 1].sum(),
    }
