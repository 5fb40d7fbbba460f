"""Renderer: rays -> packed samples (occupancy-skipping march) -> field -> composited outputs.

Field protocol (``models/field.py`` implements it)::

    field(positions float32 [S, 3], directions float32 [S, 3]) -> (sigmas [S], rgbs [S, 3])
    field.density(positions float32 [S, 3]) -> sigmas [S]

and, for ``reuse_features``, the pair that hands the density pass's encoding to the differentiable pass::

    field.density_and_features(positions [S, 3]) -> (sigmas [S], features [S, C])
    field(positions [S, 3], directions [S, 3], features [S, C]) -> (sigmas [S], rgbs [S, 3])

Positions are NGP-space sample midpoints; directions are the (unit) ray directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ..config_keys import check_arguments
from ..config_schema import Formerly, Injected, KeysOf, Note, Range
from ..ops import Backend, as_backend
from .gradient_scaling import scale_near_gradients
from .occupancy import OccupancyGrid

__all__ = [
    "LARGE_SCENE_CONE_ANGLE",
    "RenderedRays",
    "Renderer",
    "build_renderer",
    "SampleBudget",
    "render_counts",
    "opacity_error",
    "ray_distortion",
]


@dataclass(frozen=True)
class SampleBudget:
    """A fixed sample layout for :meth:`Renderer.render_rays` (static shapes, no host sync).

    Attributes:
        march_capacity: sample slots of the marching pass (>= 1).
        sample_capacity: sample slots of the differentiable pass (>= 1).
        n_active: int64 scalar tensor, the rays to march (None: all).
    """

    march_capacity: int
    sample_capacity: int
    n_active: Tensor | None = None

    def __post_init__(self) -> None:
        if self.march_capacity < 1 or self.sample_capacity < 1:
            raise ValueError(
                f"SampleBudget: capacities must be >= 1, got {self.march_capacity}, {self.sample_capacity}"
            )


@dataclass
class RenderedRays:
    """What :meth:`Renderer.render_rays` gives for ``R`` rays: per-ray outputs, and the ``S`` samples of
    the differentiable pass (for losses over samples).

    Attributes:
        rgb: float32 [R, 3] composited colour (over the background).
        opacity: float32 [R, 1] accumulated weight.
        depth: float32 [R, 1] weighted sum of the sample midpoints (not normalized by opacity).
        ray_valid: bool [R]: the ray is in the step (all True without a budget).
        marched_counts: int64 [R] samples each ray got in the marching pass.
        weights / sigmas / t_starts / t_ends: float32 [S] of the differentiable pass's samples.
        ray_indices: int64 [S] the ray of each sample.
        packed_info: int64 [R, 2] each ray's first sample and count in the differentiable pass.
        n_samples / n_samples_rendered: int64 scalar tensors on the device, the marched and the
            rendered samples (without a budget; with one, :func:`render_counts` gives them).
    """

    rgb: Tensor
    opacity: Tensor
    depth: Tensor
    ray_valid: Tensor
    marched_counts: Tensor
    weights: Tensor
    sigmas: Tensor
    ray_indices: Tensor
    t_starts: Tensor
    t_ends: Tensor
    packed_info: Tensor
    n_samples: Tensor | None = None
    n_samples_rendered: Tensor | None = None


#: instant-ngp's cone angle for scenes larger than the unit cube (``aabb_scale > 1``)
LARGE_SCENE_CONE_ANGLE = 1.0 / 256


def build_renderer(
    aabb_scale: Annotated[int, Injected("build_nerf: the capture's box")] = 1,
    occupancy: Callable[..., OccupancyGrid] = OccupancyGrid,
    cone_angle: Annotated[float | None, Range(low=0), Formerly("model.cone_angle")] = None,
    large_scene_cone_angle: Annotated[
        float, Range(low=0), Formerly("model.large_scene_cone_angle")
    ] = LARGE_SCENE_CONE_ANGLE,
    backend: Annotated[Backend | str, Injected("build_nerf: model.net.backend")] = "auto",
    **kwargs: Annotated[Any, KeysOf(Renderer)],
) -> Renderer:
    """The renderer of a scene whose outer box is ``aabb_scale`` (the ``model.net.renderer`` config node).

    Args:
        aabb_scale: the capture's outer box (``build_nerf`` passes it).
        occupancy: factory of the occupancy grid (``model.net.renderer.occupancy``), called with
            ``aabb_scale``.
        cone_angle: the marching step grows as ``t * cone_angle``. None follows instant-ngp:
            ``large_scene_cone_angle`` when ``aabb_scale > 1`` (real captures with background), else 0.
        backend: the step's ops backend (``model.net.backend``), handed to the renderer and its grid.
        kwargs: the other :class:`Renderer` arguments (``step_size``, ``near_plane``, ...).
    """
    check_arguments(build_renderer, locals())
    if cone_angle is None:
        cone_angle = large_scene_cone_angle if aabb_scale > 1 else 0.0
    backend = as_backend(backend)
    grid = occupancy(aabb_scale=aabb_scale, ops=backend)
    return Renderer(grid, cone_angle=cone_angle, backend=backend, **kwargs)


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
        backend: the step's :class:`~nerf_lightning.ops.Backend` (``model.net.backend``), or its name.
        compact_samples: when gradients are on, first evaluate densities without gradients, drop the
            samples behind the early-termination point (transmittance < ``early_stop_eps``; their
            weight is exactly 0) and run the differentiable pass on the rest only, as instant-ngp's
            training kernels do. Same outputs and gradients; far less work behind opaque surfaces.
        gradient_scaling_distance: when gradients are on, scale each sample's density and colour
            gradient by ``min(1, (t / distance)^2)`` (``volume/gradient_scaling.py``); None: off.
        reuse_features: with ``compact_samples``, the differentiable pass takes the kept samples'
            encoding from the density pass (``field.density_and_features``; the same value) instead of
            encoding them again; a field without that method encodes them again.
    """

    def __init__(
        self,
        occupancy: OccupancyGrid,
        *,
        step_size: Annotated[
            float, Range(above=0), Note("the marching step in NGP units"), Formerly("model.step_size")
        ] = math.sqrt(3.0) / 1024,
        cone_angle: float = 0.0,
        max_samples_per_ray: Annotated[int, Range(low=1), Formerly("model.max_samples_per_ray")] = 1024,
        near_plane: Annotated[float, Range(low=0), Formerly("model.near_plane")] = 0.2,
        early_stop_eps: Annotated[float, Range(low=0, below=1), Formerly("model.early_stop_eps")] = 1e-4,
        compact_samples: Annotated[bool, Formerly("model.compact_samples")] = True,
        gradient_scaling_distance: Annotated[
            float | None, Range(above=0), Note("null: off"), Formerly("model.gradient_scaling_distance")
        ] = 1.0,
        reuse_features: bool = False,
        backend: Annotated[Backend | str, Injected("build_renderer: model.net.backend")] = "auto",
    ) -> None:
        super().__init__()
        check_arguments(Renderer, locals())
        self.occupancy = occupancy
        self.step_size = float(step_size)
        self.cone_angle = float(cone_angle)
        self.max_samples_per_ray = int(max_samples_per_ray)
        self.near_plane = float(near_plane)
        self.early_stop_eps = float(early_stop_eps)
        self.compact_samples = bool(compact_samples)
        self.gradient_scaling_distance = gradient_scaling_distance
        self.reuse_features = bool(reuse_features)
        # The Backend, not its namespace: modules cannot be deep-copied/pickled with the renderer.
        self.backend = as_backend(backend)

    @property
    def ops(self) -> Any:
        """The ops namespace of :attr:`backend` (the training step's loss kernels use it too)."""
        return self.backend.ops

    def render_rays(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        background: Tensor | None,
        *,
        jitter: bool,
        budget: SampleBudget | None = None,
    ) -> RenderedRays:
        """Render a batch of rays: march, (compact), field, composite.

        Without a ``budget`` every ray is marched and the shapes follow the data. With one, the shapes
        are static and nothing is read back by the host (instant-ngp's and nerfacc's training path, which
        a CUDA graph can capture):

        1. rays ``0 .. budget.n_active - 1`` are marched into ``budget.march_capacity`` sample slots
           (``ops.march_rays_fixed``; rays that do not fit are dropped, in index order);
        2. the kept samples are repacked into ``budget.sample_capacity`` slots (``ops.repack``; rays
           that do not fit are dropped) for the differentiable pass.

        Dropped rays have ``ray_valid`` False and must be left out of the loss; the padding slots of the
        fixed layout have zero length, so they add nothing to outputs or gradients. With
        ``compact_samples`` and gradients on, samples behind the early-termination point (weight
        exactly 0) are left out of the differentiable pass in both layouts.

        Args:
            field: see the module docstring.
            rays_o: float32 [R, 3] NGP-space origins.
            rays_d: float32 [R, 3] unit directions.
            background: float32 [R, 3], [3] or None (black).
            jitter: shift each ray's first sample by a uniform fraction of a step (training).
            budget: the fixed sample layout, or None.

        Returns:
            :class:`RenderedRays`; its sample counts without a budget only (with one, the training
            step reduces them in its own kernel).
        """
        # the differentiable pass alone needs no samples behind the early-termination point
        compact = self.compact_samples and torch.is_grad_enabled()
        with torch.no_grad():
            if budget is None:
                marched, valid, marched_counts, features = self._march(field, rays_o, rays_d, jitter, compact)
            else:
                marched, valid, marched_counts, features = self._march_budgeted(
                    field, rays_o, rays_d, jitter, compact, budget
                )
        ray_indices, t_starts, t_ends, packed_info = marched
        sigmas, composited = self._composite(
            field, rays_o, rays_d, background, ray_indices, t_starts, t_ends, packed_info, features
        )
        counted = budget is None
        return RenderedRays(
            **composited,
            ray_valid=valid,
            marched_counts=marched_counts,
            sigmas=sigmas,
            ray_indices=ray_indices,
            t_starts=t_starts,
            t_ends=t_ends,
            packed_info=packed_info,
            n_samples=marched_counts.sum() if counted else None,
            n_samples_rendered=packed_info[:, 1].sum() if counted else None,
        )

    def _march(
        self, field: Any, rays_o: Tensor, rays_d: Tensor, jitter: bool, compact: bool
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], Tensor, Tensor, Tensor | None]:
        """Every ray marched into packed samples (``compact``: without the terminated ones), all rays
        valid, the samples each ray got in the marching pass, and the kept samples' features (see
        :meth:`_densities`)."""
        n_rays = rays_o.shape[0]
        options = self._march_options(jitter, n_rays, rays_o.device)
        packed = self.ops.march_rays(*self._march_inputs(rays_o, rays_d), **options)
        ray_indices, t_starts, t_ends, packed_info = packed
        marched_counts = packed_info[:, 1]
        features = None
        if compact and t_starts.shape[0] > 0:
            packed, features = self._drop_terminated(
                field, rays_o, rays_d, ray_indices, t_starts, t_ends, packed_info
            )
        valid = torch.ones(n_rays, dtype=torch.bool, device=rays_o.device)
        return tuple(packed), valid, marched_counts, features  # type: ignore[return-value]

    def _march_budgeted(
        self, field: Any, rays_o: Tensor, rays_d: Tensor, jitter: bool, compact: bool, budget: SampleBudget
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], Tensor, Tensor, Tensor | None]:
        """The first ``budget.n_active`` rays marched into the budget's fixed layouts, which rays fit,
        the samples each ray got in the marching pass, and the kept samples' features (see
        :meth:`_densities`)."""
        ops = self.ops
        n_rays = rays_o.shape[0]
        marched, valid = ops.march_rays_fixed(
            *self._march_inputs(rays_o, rays_d),
            capacity=budget.march_capacity,
            n_active=budget.n_active,
            **self._march_options(jitter, n_rays, rays_o.device),
        )
        features = None
        if compact:
            positions, _ = ops.sample_points(rays_o, rays_d, *marched[:3])
            sigmas, features = self._densities(field, positions)
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
        packed, valid = ops.repack(marched, keep, budget.sample_capacity, valid)
        if features is not None:  # kept samples are a prefix of each ray's: one gather follows them
            features = features.index_select(0, ops.repacked_prefix_slots(packed, marched.packed_info))
        return tuple(packed[:4]), valid, marched.packed_info[:, 1], features  # type: ignore[return-value]

    def _densities(self, field: Any, positions: Tensor) -> tuple[Tensor, Tensor | None]:
        """The density pass: float32 sigmas [S] and, with ``reuse_features`` and a field that has
        ``density_and_features``, the encoding's features [S, C] for the differentiable pass (else None)."""
        if self.reuse_features and hasattr(field, "density_and_features"):
            sigmas, features = field.density_and_features(positions)
            return sigmas.reshape(-1).float(), features
        return field.density(positions).reshape(-1).float(), None

    def _march_inputs(self, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, ...]:
        """The marching ops' positional inputs: rays, their entry and exit of the outer box, the grid."""
        t_near, t_far, _ = self.ops.ray_aabb_intersect(rays_o, rays_d, self.occupancy.aabb)
        return rays_o, rays_d, t_near, t_far, self.occupancy.binaries

    def _march_options(self, jitter: bool, n_rays: int, device: torch.device) -> dict[str, Any]:
        """The marching ops' keywords: the step rule, and each ray's random first offset (training)."""
        return {
            "step_size": self.step_size,
            "cone_angle": self.cone_angle,
            "max_samples_per_ray": self.max_samples_per_ray,
            "near_plane": self.near_plane,
            "t_jitter": torch.rand(n_rays, device=device) if jitter else None,
        }

    def _composite(
        self,
        field: Any,
        rays_o: Tensor,
        rays_d: Tensor,
        background: Tensor | None,
        ray_indices: Tensor,
        t_starts: Tensor,
        t_ends: Tensor,
        packed_info: Tensor,
        features: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The differentiable pass: the field's densities at the samples (their encoding ``features``
        from the density pass, when given), and the composited ``rgb``, ``opacity``, ``depth`` and
        ``weights`` (``ops.volume_render``)."""
        ops = self.ops
        connect = None
        if t_starts.shape[0] > 0:
            positions, dirs = ops.sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
            sigmas, rgbs = field(positions, dirs) if features is None else field(positions, dirs, features)
            sigmas, rgbs = self._scale_gradients(sigmas.reshape(-1), rgbs.reshape(-1, 3), t_starts, t_ends)
        else:
            # No samples at all: skip the field (empty batches break some encodings), but keep the
            # outputs connected to its parameters (zero gradient) so backward/DDP see a graph.
            sigmas = torch.zeros(0, device=rays_o.device)
            rgbs = torch.zeros(0, 3, device=rays_o.device)
            if torch.is_grad_enabled():
                s0, c0 = field(rays_o.new_full((1, 3), 0.5), rays_o.new_tensor([[0.0, 0.0, 1.0]]))
                connect = (s0.sum() + c0.sum()) * 0.0
        out = ops.volume_render(
            sigmas,
            rgbs,
            t_starts,
            t_ends,
            ray_indices,
            rays_o.shape[0],
            packed_info=packed_info,
            background=background,
            early_stop_eps=self.early_stop_eps,
        )
        if connect is not None:
            out["rgb"] = out["rgb"] + connect
        return sigmas, out

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
    ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], Tensor | None]:
        """Packed samples whose transmittance is still >= ``early_stop_eps`` under the current field, and
        their features (see :meth:`_densities`)."""
        n_rays = rays_o.shape[0]
        positions, _ = self.ops.sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
        sigmas, features = self._densities(field, positions)
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
        info = torch.stack([starts, counts], dim=-1).to(packed_info.dtype)
        return (ray_indices, t_starts, t_ends, info), None if features is None else features[keep]

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
                parts[k].append(getattr(out, k))
            assert out.n_samples is not None  # counted: no budget
            n_samples = n_samples + out.n_samples
        if n == 0:
            dims = {"rgb": 3, "opacity": 1, "depth": 1}
            return {**{k: rays_o.new_zeros(0, d) for k, d in dims.items()}, "n_samples": n_samples}
        return {**{k: torch.cat(v) for k, v in parts.items()}, "n_samples": n_samples}


def ray_distortion(out: RenderedRays, ops: Any) -> Tensor:
    """Distortion loss [R] of a :meth:`Renderer.render_rays` result
    (``ops.distortion_loss`` over its packed samples), differentiable.

    Args:
        out: the render result.
        ops: the ops namespace to run it with, the renderer's (``Renderer.ops``) in training, so
            that the step's backend (``model.net.backend``) runs it.
    """
    return ops.distortion_loss(out.weights, out.t_starts, out.t_ends, out.ray_indices, out.packed_info)


def opacity_error(out: RenderedRays, alpha: Tensor) -> Tensor:
    """Squared error [R] of a render result's opacity against the target ``alpha`` [R] (the opacity
    loss of ``model.net.loss.alpha_weight``), differentiable."""
    return (out.opacity.reshape(-1) - alpha).square()


def render_counts(out: RenderedRays) -> dict[str, Tensor]:
    """int64 scalar tensors of a :meth:`Renderer.render_rays` result: ``n_rays`` (valid rays),
    ``n_samples`` (marched samples of the valid rays), ``n_samples_rendered`` (samples in the
    differentiable pass)."""
    valid = out.ray_valid
    return {
        "n_rays": valid.sum(),
        "n_samples": (out.marched_counts * valid).sum(),
        "n_samples_rendered": out.packed_info[:, 1].sum(),
    }
