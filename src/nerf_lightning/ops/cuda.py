"""CUDA backend of the ray ops (and the hash / SH encoding kernels), same API as ``ops/reference.py``.

Each function has the reference's name, signature, shapes and dtypes (see that module for the full
contract); it runs our extension (``ops/csrc``, built on first use by ``ops/_ext.py``) when the
tensors are float32 on a CUDA device, and otherwise calls the reference, so it is always safe to
call. Differences from the reference, all within float rounding:

- ``march_rays``: t values are computed with the same float32 operation sequence (bit-identical in
  practice); the kernel walks candidates until ``t_{k+1} > t_far`` instead of over the reference's
  global candidate count, which can differ only in float-boundary ties.
- ``render_weights`` / ``volume_render``: per-ray float64 optical depth (the reference subtracts a
  global float64 cumsum); gradients by the closed form below instead of autograd.
  ``volume_render`` stops each ray at ``T < early_stop_eps`` (weights 0 beyond, as the reference).
- ``grid_occupancy``, ``cascade_of``, ``grid_cell_indices`` and ``accumulate_along_rays`` are the
  reference functions (a few fused torch kernels already; not on the hot path or already one
  ``index_add``).

- ``march_rays_fixed``: one count pass, a device cumsum, one layout kernel and one fill pass into
  the caller's capacity: no host sync, so it can run inside a CUDA graph. ``repack``: a count pass,
  the same cumsum and layout kernel, and a copy pass (one thread per ray each).

- ``sample_points``, ``normalize_to_box``: the reference's float32 sequence (bit-equal).
- ``masked_ray_loss``, ``adapt_ray_count``: sums over blocks added in block order by the last block
  to finish (deterministic; float64 where the reference sums float32). ``density_activation``:
  ``expf`` where the reference calls ``torch.exp`` (within an ulp). These and the fixed-layout
  kernels exist to cut the training step's kernel count (``models/train_step.py``).
- ``volume_render`` composites a background that needs no gradient inside its kernels.
- ``fused_mlp``: one tensor-core kernel per network and direction; products accumulate in float32 in
  another order than the reference's matmul, and the backward pass rounds the output gradient to
  the half type as well (``ops/csrc/mlp.cu``).
- ``distortion_loss``: one warp per ray, within-ray float64 warp scans of the prefix sums (the
  reference subtracts global float64 cumsums and gathers them per sample, whose backward serializes
  the fixed layout's padding, all of ray 0, on one warp); gradient by the closed form below. It reads
  only the samples inside each ray's ``packed_info`` range, so padding has no loss and gradient 0.

Kernel shapes: marching and compositing run one warp per ray (32 candidates / samples per step,
warp ballots and float64 warp scans), the hash encoding one thread per (point, level).
``NERF_LIGHTNING_HASH_ORDER=level`` switches the hash kernels to a level-major thread order (same
results; a benchmark switch).

Autograd functions use ``torch.amp.custom_fwd/custom_bwd(device_type="cuda")``: under autocast
(16-mixed, bf16-mixed) compositing inputs are cast to float32; the hash encoding keeps fp16/fp32
params as they are and returns float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import reference as _ref
from ._ext import load as _load
from .encoding_reference import hash_encode_torch, sh_encode_torch
from .fused_mlp_support import fused_mlp_shapes_ok, has_mma_m16n8k16
from .types import PackedSamples

SQRT3 = _ref.SQRT3
MISS_T = _ref.MISS_T

__all__ = [
    "SQRT3",
    "MISS_T",
    "PackedSamples",
    "is_available",
    "ray_aabb_intersect",
    "grid_cell_positions",
    "cascade_of",
    "grid_cell_indices",
    "grid_ema_update",
    "grid_occupancy",
    "pack_bitfield",
    "unpack_bitfield",
    "march_rays",
    "march_rays_fixed",
    "repack",
    "render_weights",
    "accumulate_along_rays",
    "volume_render",
    "sample_points",
    "normalize_to_box",
    "distortion_loss",
    "masked_ray_loss",
    "adapt_ray_count",
    "density_activation",
    "training_rays",
    "sample_pixels",
    "fused_mlp",
    "hash_encode",
    "sh_encode",
]

# Reference functions reused as they are.
cascade_of = _ref.cascade_of
grid_cell_indices = _ref.grid_cell_indices
grid_occupancy = _ref.grid_occupancy
accumulate_along_rays = _ref.accumulate_along_rays


def is_available() -> bool:
    """True when the extension is built/loaded and a CUDA GPU is visible (first call may build it)."""
    return torch.cuda.is_available() and _load() is not None


def _ext() -> Any:
    return _load()


def _on_cuda(*tensors: Tensor) -> bool:
    return all(t.is_cuda for t in tensors) and is_available()


# --------------------------------------------------------------------------------------------------
# Rays / boxes, occupancy helpers
# --------------------------------------------------------------------------------------------------
def ray_aabb_intersect(rays_o: Tensor, rays_d: Tensor, aabb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.ray_aabb_intersect` (float32 [R,3] x2, [6] -> [R] x3)."""
    _ref._check_rays(rays_o, rays_d, "ray_aabb_intersect")
    if aabb.shape != (6,):
        raise ValueError(f"ray_aabb_intersect: aabb must have shape [6], got {tuple(aabb.shape)}")
    if rays_o.dtype != torch.float32 or rays_d.dtype != torch.float32 or not _on_cuda(rays_o, rays_d):
        return _ref.ray_aabb_intersect(rays_o, rays_d, aabb)
    box = aabb.to(device=rays_o.device, dtype=torch.float32).contiguous()
    t_near, t_far, hit = _ext().ray_aabb_intersect(rays_o.contiguous(), rays_d.contiguous(), box)
    return t_near, t_far, hit


def grid_cell_positions(cell_indices: Tensor, jitter: Tensor, grid_resolution: int) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.grid_cell_positions` (int64 [N], float [N,3] -> [N,3])."""
    if cell_indices.dim() != 1 or jitter.shape != (cell_indices.shape[0], 3):
        raise ValueError(
            f"grid_cell_positions: expected cell_indices [N] and jitter [N, 3], got "
            f"{tuple(cell_indices.shape)} and {tuple(jitter.shape)}"
        )
    if jitter.dtype != torch.float32 or not _on_cuda(cell_indices, jitter):
        return _ref.grid_cell_positions(cell_indices, jitter, grid_resolution)
    return _ext().grid_cell_positions(
        cell_indices.long().contiguous(), jitter.contiguous(), int(grid_resolution)
    )


def grid_ema_update(density_grid: Tensor, cell_indices: Tensor, densities: Tensor, decay: float) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.grid_ema_update` (float32 [C,G^3] -> new [C,G^3])."""
    if cell_indices.shape != densities.shape or cell_indices.dim() != 1:
        raise ValueError(
            f"grid_ema_update: cell_indices and densities must both be [N], got "
            f"{tuple(cell_indices.shape)} and {tuple(densities.shape)}"
        )
    if density_grid.dtype != torch.float32 or not _on_cuda(density_grid, cell_indices, densities):
        return _ref.grid_ema_update(density_grid, cell_indices, densities, decay)
    return _ext().grid_ema_update(
        density_grid.contiguous(),
        cell_indices.long().contiguous(),
        densities.detach().float().contiguous(),
        float(decay),
    )


def pack_bitfield(binaries: Tensor) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.pack_bitfield` (bool [C,G,G,G] -> uint8 [C*G^3/8])."""
    if binaries.dtype != torch.bool or not _on_cuda(binaries) or binaries.numel() % 8 != 0:
        return _ref.pack_bitfield(binaries)
    return _ext().pack_bitfield(binaries.contiguous())


def unpack_bitfield(bits: Tensor, n_cascades: int, grid_resolution: int) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.unpack_bitfield` (uint8 [C*G^3/8] -> bool [C,G,G,G])."""
    g = int(grid_resolution)
    if bits.shape != (n_cascades * g**3 // 8,) or bits.dtype != torch.uint8 or not _on_cuda(bits):
        return _ref.unpack_bitfield(bits, n_cascades, grid_resolution)
    return _ext().unpack_bitfield(bits.contiguous(), int(n_cascades), g)


# --------------------------------------------------------------------------------------------------
# Marching
# --------------------------------------------------------------------------------------------------
def march_rays(
    rays_o: Tensor,
    rays_d: Tensor,
    t_near: Tensor,
    t_far: Tensor,
    binaries: Tensor,
    *,
    step_size: float = SQRT3 / 1024,
    cone_angle: float = 0.0,
    max_step: float | None = None,
    max_samples_per_ray: int = 1024,
    near_plane: float = 0.0,
    t_jitter: Tensor | None = None,
) -> PackedSamples:
    """See :func:`nerf_lightning.ops.reference.march_rays`.

    Two passes of one thread per ray (count, then write at the exclusive-cumsum offsets); one host
    sync to size the [S] outputs, as the reference.
    """
    max_step = _ref._check_march_args(
        rays_o, rays_d, t_near, t_far, binaries, t_jitter, step_size, cone_angle, max_step,
        max_samples_per_ray,
    )  # fmt: skip
    tensors = [rays_o, rays_d, t_near, t_far] + ([t_jitter] if t_jitter is not None else [])
    if any(t.dtype != torch.float32 for t in tensors) or not _on_cuda(*tensors, binaries):
        return _ref.march_rays(
            rays_o,
            rays_d,
            t_near,
            t_far,
            binaries,
            step_size=step_size,
            cone_angle=cone_angle,
            max_step=max_step,
            max_samples_per_ray=max_samples_per_ray,
            near_plane=near_plane,
            t_jitter=t_jitter,
        )
    ray_idx, t_s, t_e, info = _ext().march_rays(
        rays_o.contiguous(),
        rays_d.contiguous(),
        t_near.contiguous(),
        t_far.contiguous(),
        binaries.contiguous(),
        t_jitter.contiguous() if t_jitter is not None else None,
        float(step_size),
        float(cone_angle),
        float(max_step),
        int(max_samples_per_ray),
        float(near_plane),
    )
    return PackedSamples(ray_idx, t_s, t_e, info)


def march_rays_fixed(
    rays_o: Tensor,
    rays_d: Tensor,
    t_near: Tensor,
    t_far: Tensor,
    binaries: Tensor,
    *,
    capacity: int,
    n_active: Tensor | None = None,
    step_size: float = SQRT3 / 1024,
    cone_angle: float = 0.0,
    max_step: float | None = None,
    max_samples_per_ray: int = 1024,
    near_plane: float = 0.0,
    t_jitter: Tensor | None = None,
) -> tuple[PackedSamples, Tensor]:
    """See :func:`nerf_lightning.ops.reference.march_rays_fixed` (no host sync on the CUDA path)."""
    max_step = _ref._check_march_args(
        rays_o, rays_d, t_near, t_far, binaries, t_jitter, step_size, cone_angle, max_step,
        max_samples_per_ray,
    )  # fmt: skip
    tensors = [rays_o, rays_d, t_near, t_far] + ([t_jitter] if t_jitter is not None else [])
    n_ok = n_active is None or (n_active.dtype == torch.int64 and n_active.numel() == 1)
    if any(t.dtype != torch.float32 for t in tensors) or not n_ok or not _on_cuda(*tensors, binaries):
        return _ref.march_rays_fixed(
            rays_o,
            rays_d,
            t_near,
            t_far,
            binaries,
            capacity=capacity,
            n_active=n_active,
            step_size=step_size,
            cone_angle=cone_angle,
            max_step=max_step,
            max_samples_per_ray=max_samples_per_ray,
            near_plane=near_plane,
            t_jitter=t_jitter,
        )
    ray_idx, t_s, t_e, info, valid = _ext().march_rays_fixed(
        rays_o.contiguous(),
        rays_d.contiguous(),
        t_near.contiguous(),
        t_far.contiguous(),
        binaries.contiguous(),
        t_jitter.contiguous() if t_jitter is not None else None,
        n_active.reshape(()).contiguous() if n_active is not None else None,
        float(step_size),
        float(cone_angle),
        float(max_step),
        int(max_samples_per_ray),
        float(near_plane),
        int(capacity),
    )
    return PackedSamples(ray_idx, t_s, t_e, info), valid


def repack(
    packed: PackedSamples, keep: Tensor, capacity: int, ray_valid: Tensor | None = None
) -> tuple[PackedSamples, Tensor]:
    """See :func:`nerf_lightning.ops.reference.repack` (no host sync; equal to it exactly)."""
    _ref._check_repack_args(packed, keep, capacity)
    _, t_starts, t_ends, packed_info = packed
    tensors = [t_starts, t_ends, packed_info, keep] + ([ray_valid] if ray_valid is not None else [])
    if t_starts.dtype != torch.float32 or t_ends.dtype != torch.float32 or not _on_cuda(*tensors):
        return _ref.repack(packed, keep, capacity, ray_valid)
    idx, ts, te, info, valid = _ext().repack(
        t_starts.contiguous(), t_ends.contiguous(), packed_info.long().contiguous(), keep.contiguous(),
        int(capacity), ray_valid.contiguous() if ray_valid is not None else None,
    )  # fmt: skip
    return PackedSamples(idx, ts, te, info), valid


# --------------------------------------------------------------------------------------------------
# Volume rendering
# --------------------------------------------------------------------------------------------------
def _packed_info_from(ray_indices: Tensor, n_rays: int) -> Tensor:
    """int64 [R, 2] (first, count) from non-decreasing ray indices, without a host sync."""
    counts = torch.zeros(n_rays, dtype=torch.long, device=ray_indices.device)
    counts.index_add_(0, ray_indices.long(), torch.ones_like(ray_indices, dtype=torch.long))
    return torch.stack([torch.cumsum(counts, 0) - counts, counts], dim=-1)


class _RenderWeights(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(
        ctx: Any, sigmas: Tensor, t_starts: Tensor, t_ends: Tensor, packed_info: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        sig, ts, te = sigmas.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        w, trans = _ext().render_weights_fwd(sig, ts, te, info, float(eps))
        ctx.save_for_backward(sig, ts, te, info, w, trans)
        ctx.eps = float(eps)
        ctx.set_materialize_grads(False)
        return w, trans

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_w: Tensor | None, grad_trans: Tensor | None) -> tuple:
        sig, ts, te, info, w, trans = ctx.saved_tensors
        if grad_w is None and grad_trans is None:
            return None, None, None, None, None
        gw = torch.zeros_like(sig) if grad_w is None else grad_w.float().contiguous()
        gt = None if grad_trans is None else grad_trans.float().contiguous()
        gsig = _ext().render_weights_bwd(gw, gt, sig, ts, te, info, w, trans, ctx.eps)
        return gsig, None, None, None, None


def render_weights(
    sigmas: Tensor,
    t_starts: Tensor,
    t_ends: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    packed_info: Tensor | None = None,
    early_stop_eps: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.render_weights` (-> weights [S], transmittance [S]).

    Gradient w.r.t. ``sigmas`` (closed form, per ray):
    ``dL/dsigma_k = delta_k (g_k T_k e^{-tau_k} [T_k >= eps] - sum_{i>k} g_i w_i - sum_{i>k} gT_i T_i)``.
    """
    n = sigmas.shape[0]
    if not (sigmas.shape == t_starts.shape == t_ends.shape == ray_indices.shape == (n,)):
        raise ValueError(
            "render_weights: sigmas, t_starts, t_ends, ray_indices must all be [S], got "
            f"{tuple(sigmas.shape)}, {tuple(t_starts.shape)}, {tuple(t_ends.shape)}, "
            f"{tuple(ray_indices.shape)}"
        )
    if sigmas.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not _on_cuda(
        sigmas, t_starts, t_ends
    ):
        return _ref.render_weights(sigmas, t_starts, t_ends, ray_indices, n_rays, packed_info, early_stop_eps)
    if packed_info is None:
        packed_info = _packed_info_from(ray_indices, n_rays)
    w, trans = _RenderWeights.apply(
        sigmas.float(), t_starts.float(), t_ends.float(), packed_info.long(), early_stop_eps
    )
    return w, trans


class _VolumeRender(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(
        ctx: Any,
        sigmas: Tensor,
        rgbs: Tensor,
        t_starts: Tensor,
        t_ends: Tensor,
        packed_info: Tensor,
        eps: float,
        background: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        sig, rgb, ts, te = sigmas.contiguous(), rgbs.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        bg = None if background is None else background.detach().float().contiguous()
        out_rgb, out_op, out_depth, w = _ext().volume_render_fwd(sig, rgb, ts, te, info, float(eps), bg)
        ctx.save_for_backward(sig, rgb, ts, te, info, w, *([] if bg is None else [bg]))
        ctx.eps = float(eps)
        ctx.set_materialize_grads(False)
        return out_rgb, out_op, out_depth, w

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(
        ctx: Any, g_rgb: Tensor | None, g_op: Tensor | None, g_depth: Tensor | None, g_w: Tensor | None
    ) -> tuple:
        sig, rgb, ts, te, info, w, *bg = ctx.saved_tensors
        if g_rgb is None and g_op is None and g_depth is None and g_w is None:
            return None, None, None, None, None, None, None

        def opt(g: Tensor | None) -> Tensor | None:
            return None if g is None else g.float().contiguous()

        g_sig, g_rgbs = _ext().volume_render_bwd(
            sig.new_zeros((info.shape[0], 3)) if g_rgb is None else g_rgb.float().contiguous(),
            opt(g_op),
            opt(g_depth),
            opt(g_w),
            sig,
            rgb,
            ts,
            te,
            info,
            w,
            ctx.eps,
            bg[0] if bg else None,
        )
        return g_sig, g_rgbs, None, None, None, None, None


def volume_render(
    sigmas: Tensor,
    rgbs: Tensor,
    t_starts: Tensor,
    t_ends: Tensor,
    ray_indices: Tensor,
    n_rays: int,
    packed_info: Tensor | None = None,
    background: Tensor | None = None,
    early_stop_eps: float = 1e-4,
) -> dict[str, Tensor]:
    """See :func:`nerf_lightning.ops.reference.volume_render` (fused forward/backward kernels).

    Returns dict(rgb [R,3], opacity [R,1], depth [R,1], weights [S]), differentiable w.r.t. sigmas
    and rgbs (and ``background``, through torch).
    """
    n = sigmas.shape[0]
    if rgbs.shape != (n, 3):
        raise ValueError(f"volume_render: rgbs must be [S, 3] with S={n}, got {tuple(rgbs.shape)}")
    if not (sigmas.shape == t_starts.shape == t_ends.shape == ray_indices.shape == (n,)):
        raise ValueError(
            "volume_render: sigmas, t_starts, t_ends, ray_indices must all be [S], got "
            f"{tuple(sigmas.shape)}, {tuple(t_starts.shape)}, {tuple(t_ends.shape)}, "
            f"{tuple(ray_indices.shape)}"
        )
    if background is not None and background.shape not in ((3,), (n_rays, 3)):
        raise ValueError(
            f"volume_render: background must be [3] or [{n_rays}, 3], got {tuple(background.shape)}"
        )
    ok_dtype = sigmas.dtype in (torch.float32, torch.float16, torch.bfloat16)
    if not ok_dtype or rgbs.dtype == torch.float64 or not _on_cuda(sigmas, rgbs, t_starts, t_ends):
        return _ref.volume_render(
            sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, packed_info, background, early_stop_eps
        )
    if packed_info is None:
        packed_info = _packed_info_from(ray_indices, n_rays)
    # a constant background (data) is composited inside the kernels; one that needs a gradient, by torch
    fused = background is not None and background.is_cuda and not background.requires_grad
    fused_bg = background if fused else None
    rgb, opacity, depth, weights = _VolumeRender.apply(
        sigmas.float(), rgbs.float(), t_starts.float(), t_ends.float(), packed_info.long(), early_stop_eps,
        fused_bg,
    )  # fmt: skip
    if background is not None and fused_bg is None:
        rgb = rgb + (1.0 - opacity) * background.to(rgb.dtype)
    return {"rgb": rgb, "opacity": opacity, "depth": depth, "weights": weights}


# --------------------------------------------------------------------------------------------------
# Regularizers on packed samples
# --------------------------------------------------------------------------------------------------
class _DistortionLoss(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx: Any, weights: Tensor, t_starts: Tensor, t_ends: Tensor, packed_info: Tensor) -> Tensor:
        w, ts, te = weights.contiguous(), t_starts.contiguous(), t_ends.contiguous()
        info = packed_info.contiguous()
        loss = _ext().distortion_loss_fwd(w, ts, te, info)
        ctx.save_for_backward(w, ts, te, info)
        ctx.set_materialize_grads(False)
        return loss

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, g_loss: Tensor | None) -> tuple:
        if g_loss is None:
            return None, None, None, None
        w, ts, te, info = ctx.saved_tensors
        # contiguous(): the gradient of a sum arrives expanded (stride 0)
        g_w = _ext().distortion_loss_bwd(g_loss.float().contiguous(), w, ts, te, info)
        return g_w, None, None, None


def distortion_loss(
    weights: Tensor, t_starts: Tensor, t_ends: Tensor, ray_indices: Tensor, packed_info: Tensor
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.distortion_loss` (-> float32 [R], differentiable w.r.t.
    ``weights``): one kernel each way, no host sync (CUDA-graph capturable).

    One warp per ray over the samples of its ``packed_info`` range (``ray_indices`` is not read: in
    every layout the ranges say which samples a ray has, and padding lies outside all of them).
    Gradient (closed form of the reference's, per ray, ``W_k``/``M_k`` the exclusive prefix sums and
    ``W``/``M`` the ray's totals of ``w`` and ``w m``):
    ``dL/dw_k = g_r (2 (m_k (2 W_k - W) + M - 2 M_k) + 2 w_k (t_end_k - t_start_k) / 3)``.
    """
    n = weights.shape[0]
    if not (weights.shape == t_starts.shape == t_ends.shape == ray_indices.shape == (n,)):
        raise ValueError(
            "distortion_loss: weights, t_starts, t_ends, ray_indices must all be [S], got "
            f"{tuple(weights.shape)}, {tuple(t_starts.shape)}, {tuple(t_ends.shape)}, "
            f"{tuple(ray_indices.shape)}"
        )
    if packed_info.dim() != 2 or packed_info.shape[1] != 2:
        raise ValueError(f"distortion_loss: packed_info must be [R, 2], got {tuple(packed_info.shape)}")
    ok_dtype = weights.dtype in (torch.float32, torch.float16, torch.bfloat16)
    ok_t = t_starts.dtype == torch.float32 and t_ends.dtype == torch.float32
    if not (ok_dtype and ok_t) or not _on_cuda(weights, t_starts, t_ends, packed_info):
        return _ref.distortion_loss(weights, t_starts, t_ends, ray_indices, packed_info)
    return _DistortionLoss.apply(weights.float(), t_starts, t_ends, packed_info.long())


# --------------------------------------------------------------------------------------------------
# Sample positions, the fixed-budget step's loss and ray count (one kernel each)
# --------------------------------------------------------------------------------------------------
class _SamplePoints(torch.autograd.Function):
    """The kernel forward; the rays' gradient (learned camera poses) scattered back per ray."""

    @staticmethod
    def forward(
        ctx: Any, rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
    ) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(ray_indices, t_starts, t_ends)
        ctx.n_rays = rays_o.shape[0]
        positions, dirs = _ext().sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
        return positions, dirs

    @staticmethod
    def backward(ctx: Any, g_pos: Tensor | None, g_dir: Tensor | None) -> tuple:
        ray_indices, t_starts, t_ends = ctx.saved_tensors
        shape = (ctx.n_rays, 3)
        g_pos = torch.zeros(t_starts.shape[0], 3, device=t_starts.device) if g_pos is None else g_pos.float()
        g_o = torch.zeros(shape, device=t_starts.device).index_add_(0, ray_indices, g_pos)
        g_d_samples = g_pos * ((t_starts + t_ends) * 0.5)[:, None]
        if g_dir is not None:
            g_d_samples = g_d_samples + g_dir.float()
        g_d = torch.zeros(shape, device=t_starts.device).index_add_(0, ray_indices, g_d_samples)
        return g_o, g_d, None, None, None


def sample_points(
    rays_o: Tensor, rays_d: Tensor, ray_indices: Tensor, t_starts: Tensor, t_ends: Tensor
) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.sample_points` (same float32 sequence: bit-equal).
    Differentiable w.r.t. the rays when they require it (learned camera poses)."""
    tensors = (rays_o, rays_d, t_starts, t_ends)
    if any(t.dtype != torch.float32 for t in tensors) or not _on_cuda(*tensors, ray_indices):
        return _ref.sample_points(rays_o, rays_d, ray_indices, t_starts, t_ends)
    args = (
        rays_o.contiguous(), rays_d.contiguous(), ray_indices.long().contiguous(), t_starts.contiguous(),
        t_ends.contiguous(),
    )  # fmt: skip
    if rays_o.requires_grad or rays_d.requires_grad:
        return _SamplePoints.apply(*args)
    return _ext().sample_points(*args)


def normalize_to_box(positions: Tensor, box_min: Tensor, box_size: Tensor) -> tuple[Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.normalize_to_box` (bit-equal; no gradient)."""
    tensors = (positions, box_min, box_size)
    if positions.requires_grad or any(t.dtype != torch.float32 for t in tensors) or not _on_cuda(*tensors):
        return _ref.normalize_to_box(positions, box_min, box_size)
    x, inside = _ext().normalize_to_box(positions.contiguous(), box_min.contiguous(), box_size.contiguous())
    return x, inside


def training_rays(
    poses: Tensor,
    intrinsics: Tensor,
    pixels: Tensor,
    offsets: Tensor,
    widths: Tensor,
    view_ids: Tensor,
    ix: Tensor,
    iy: Tensor,
    ux: Tensor,
    uy: Tensor,
    background: Tensor,
    table: Tensor | None = None,
    camera_of_view: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Training rays and their targets in one kernel: (rays_o, rays_d, rgb), float32 [R, 3] each.

    The ray goes through pixel position ``(ix + ux, iy + uy)`` of view ``view_ids``: pinhole
    (``(p - c) / f``) without ``table``, else bilinear in the undistorted-direction ``table``
    [U, H + 1, W + 1, 3] of camera ``camera_of_view[view]``; rotated by the pose, normalized. The
    target is ``pixels[offsets[v] + iy * widths[v] + ix] / 255``, RGBA composited over ``background``.
    The contract is the data layer's (``data/cameras.py::pixel_rays`` / ``UndistortionTable.rays`` and
    ``_ViewSet.batch``), which is also the fallback and the test oracle; CUDA tensors only."""
    return tuple(
        _ext().training_rays(
            poses.contiguous(),
            intrinsics.contiguous(),
            pixels.contiguous(),
            offsets.contiguous(),
            widths.contiguous(),
            view_ids.contiguous(),
            ix.contiguous(),
            iy.contiguous(),
            ux.contiguous(),
            uy.contiguous(),
            background.contiguous(),
            table,
            camera_of_view,
        )  # fmt: skip
    )


def sample_pixels(
    u: Tensor, cdf: Tensor, widths: Tensor, heights: Tensor, res: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Training pixels (view_ids, px, py), int64 [n] each, from uniforms ``u`` float64 [3, n] and the
    (view, cell) ``cdf`` float64 [V * res^2], in one kernel. The contract and fallback is
    ``data/sampler.py::RaySampler._pixels_of``; CUDA tensors only."""
    view_ids, px, py = _ext().sample_pixels(
        u.contiguous(), cdf.contiguous(), widths.contiguous(), heights.contiguous(), int(res)
    )
    return view_ids, px, py


class _DensityActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, inside: Tensor, bias: float) -> Tensor:
        ctx.save_for_backward(h, inside)
        ctx.bias = float(bias)
        return _ext().density_activation_fwd(h, inside, float(bias))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        h, inside = ctx.saved_tensors
        grad_h = _ext().density_activation_bwd(g.float().contiguous(), h.contiguous(), inside, ctx.bias)
        return grad_h, None, None


def density_activation(h: Tensor, inside: Tensor, bias: float) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.density_activation`: one kernel each way (the
    reference's select, cast, add, exp, mask and their backward, zeros of ``h``'s shape included)."""
    ok = (
        h.dim() == 2
        and h.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and h.stride(1) == 1
        and inside.shape == (h.shape[0],)
        and inside.dtype == torch.bool
    )
    if not ok or not _on_cuda(h, inside):
        return _ref.density_activation(h, inside, bias)
    return _DensityActivation.apply(h, inside.contiguous(), float(bias))


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, in0: Tensor, in1: Tensor | None, bf16: bool, *params: Tensor) -> Tensor:
        weights = [p.detach() for p in params[0::2]]
        biases = [p.detach() for p in params[1::2]]
        ctx.save_for_backward(in0, in1, *weights, *biases)
        ctx.bf16 = bf16
        ctx.n_layers = len(weights)
        return _ext().fused_mlp_fwd(in0, in1, weights, biases, bf16)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        in0, in1, *params = ctx.saved_tensors
        weights, biases = params[: ctx.n_layers], params[ctx.n_layers :]
        need_in0 = bool(ctx.needs_input_grad[0])
        # in1 (the colour network's view-direction encoding) needs a gradient only when the
        # directions do (learned camera poses); the kernel then writes those columns too
        need_in1 = in1 is not None and bool(ctx.needs_input_grad[1])
        g_in0, g_w, g_b, *g_in1 = _ext().fused_mlp_bwd(
            g.float().contiguous(), in0, in1, weights, biases, ctx.bf16, need_in0, need_in1
        )
        grads: list[Tensor] = []
        w_at = b_at = 0
        for w, b in zip(weights, biases, strict=True):
            grads.append(g_w[w_at : w_at + w.numel()].view_as(w))
            grads.append(g_b[b_at : b_at + b.numel()].view_as(b))
            w_at, b_at = w_at + w.numel(), b_at + b.numel()
        return (g_in0 if need_in0 else None), (g_in1[0] if need_in1 else None), None, *grads


def _fused_mlp_inputs_ok(in0: Tensor, in1: Tensor | None) -> bool:
    if in0.dim() != 2:
        return False
    return in1 is None or (in1.dim() == 2 and in1.shape[0] == in0.shape[0])


def fused_mlp(
    in0: Tensor,
    in1: Tensor | None,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    half_dtype: torch.dtype,
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.fused_mlp`: the whole network in one kernel each way
    (1 or 2 hidden layers 64 wide, input and output up to 64, fp32 weights; other shapes use the
    reference)."""
    if half_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fused_mlp: half_dtype must be float16 or bfloat16, got {half_dtype}")
    tensors = [in0, *weights, *biases] + ([] if in1 is None else [in1])
    in_width = in0.shape[-1] + (0 if in1 is None else in1.shape[-1])
    if (
        not _fused_mlp_inputs_ok(in0, in1)
        or not fused_mlp_shapes_ok(in_width, weights, biases)
        or not _on_cuda(*tensors)
        or not has_mma_m16n8k16(in0.device)
    ):
        return _ref.fused_mlp(in0, in1, weights, biases, half_dtype)
    params = [t for pair in zip(weights, biases, strict=True) for t in pair]
    x1 = None if in1 is None else in1.float().contiguous()
    return _FusedMLP.apply(
        in0.float().contiguous(), x1, half_dtype == torch.bfloat16, *[p.contiguous() for p in params]
    )


class _MaskedRayLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, pred: Tensor, target: Tensor, valid: Tensor, huber: bool, delta: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        loss, per_ray, aux = _ext().masked_ray_loss_fwd(pred, target, valid, huber, float(delta))
        ctx.save_for_backward(pred, target, valid, aux)
        ctx.huber, ctx.delta = huber, float(delta)
        ctx.mark_non_differentiable(per_ray, aux)
        ctx.set_materialize_grads(False)
        return loss, per_ray, aux

    @staticmethod
    def backward(ctx: Any, g_loss: Tensor | None, _g_per_ray: Any, _g_aux: Any) -> tuple:
        if g_loss is None:
            return None, None, None, None, None
        pred, target, valid, aux = ctx.saved_tensors
        grad = _ext().masked_ray_loss_bwd(
            g_loss.float().contiguous(), pred, target, valid, aux, ctx.huber, ctx.delta
        )
        return grad, None, None, None, None


def masked_ray_loss(
    pred: Tensor, target: Tensor, valid: Tensor, kind: str = "huber", delta: float = 0.1
) -> tuple[Tensor, Tensor, Tensor]:
    """See :func:`nerf_lightning.ops.reference.masked_ray_loss`: one forward kernel (per-ray loss and
    the sums, reduced over blocks in a fixed order) and one backward kernel."""
    if kind not in ("huber", "mse"):
        raise ValueError(f"masked_ray_loss: kind must be 'huber' or 'mse', got {kind!r}")
    n = pred.shape[0]
    ok = pred.shape == target.shape == (n, 3) and valid.shape == (n,) and valid.dtype == torch.bool
    if not ok or not _on_cuda(pred, target, valid):
        return _ref.masked_ray_loss(pred, target, valid, kind, delta)
    return _MaskedRayLoss.apply(
        pred.float().contiguous(), target.float().contiguous(), valid.contiguous(), kind == "huber", delta
    )


def adapt_ray_count(
    aux: Tensor,
    ray_valid: Tensor,
    marched_counts: Tensor,
    rendered_counts: Tensor,
    n_active: Tensor,
    n_active_f: Tensor,
    target_fraction: Tensor,
    *,
    sample_budget: int,
    march_budget: int,
    min_rays: int,
    n_slots: int,
    momentum: float,
) -> Tensor:
    """See :func:`nerf_lightning.ops.reference.adapt_ray_count`: one kernel (sums over the rays, then
    the update on one thread), with the reference's float32 operation sequence."""
    tensors = (aux, ray_valid, marched_counts, rendered_counts, n_active, n_active_f, target_fraction)
    dtypes = (torch.float64, torch.bool, torch.int64, torch.int64, torch.int64, torch.float32, torch.float32)
    scalars_ok = n_active.numel() == 1 and n_active_f.numel() == 1 and target_fraction.numel() == 1
    in_place_ok = n_active.is_contiguous() and n_active_f.is_contiguous()
    if (
        any(t.dtype != d for t, d in zip(tensors, dtypes, strict=True))
        or not (scalars_ok and in_place_ok)
        or not _on_cuda(*tensors)
    ):
        return _ref.adapt_ray_count(
            aux, ray_valid, marched_counts, rendered_counts, n_active, n_active_f, target_fraction,
            sample_budget=sample_budget, march_budget=march_budget, min_rays=min_rays, n_slots=n_slots,
            momentum=momentum,
        )  # fmt: skip
    return _ext().adapt_ray_count(
        aux.contiguous(), ray_valid.contiguous(), marched_counts.contiguous(), rendered_counts.contiguous(),
        n_active, n_active_f, target_fraction.contiguous(), float(sample_budget), float(march_budget),
        float(min_rays), float(n_slots), float(momentum),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Encodings (used by models/encoding.py)
# --------------------------------------------------------------------------------------------------
class _HashEncode(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx: Any, x: Tensor, params: Tensor, scales: list[float], resolutions: list[int], offsets: list[int]
    ) -> Tensor:
        xf = x.detach().float().contiguous()
        table = params.detach().contiguous()
        out = _ext().hash_encode_fwd(xf, table, scales, resolutions, offsets)
        ctx.save_for_backward(xf, table if ctx.needs_input_grad[0] else None)
        ctx.meta = (scales, resolutions, offsets, params.shape[0], params.shape[1], params.dtype)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        xf, table = ctx.saved_tensors
        scales, resolutions, offsets, rows, feats, pdtype = ctx.meta
        g = grad_out.float().contiguous()
        grad = grad_x = None
        if ctx.needs_input_grad[1]:
            grad = _ext().hash_encode_bwd(xf, g, rows, feats, scales, resolutions, offsets)
            if grad.dtype != pdtype:
                grad = grad.to(pdtype)  # fp16 tables: scatter in fp32, round once
        if ctx.needs_input_grad[0]:  # positions moved by learned camera poses
            grad_x = _ext().hash_encode_bwd_input(xf, table, g, scales, resolutions, offsets)
        return grad_x, grad, None, None, None


def hash_encode(
    x: Tensor, params: Tensor, scales: Sequence[float], resolutions: Sequence[int], offsets: Sequence[int]
) -> Tensor:
    """Multiresolution hash encoding on the GPU (contract: ``ops/encoding_reference.py::hash_encode_torch``).

    Args:
        x: float [N, 3] in [0, 1]^3 on CUDA (cast to float32); its gradient (the trilinear weights'
            derivative, one thread per point) is computed only when it requires one.
        params: float32 or float16 [sum_l T_l, F] table, F in {1, 2, 4, 8}.
        scales, resolutions: per level; offsets: [L + 1] cumulative rows.

    Returns:
        float32 [N, L * F], differentiable w.r.t. ``params`` (atomic scatter; fp16 tables accumulate
        in float32 and are rounded once) and ``x``.
    """
    if params.dtype == torch.bfloat16 and _on_cuda(x, params):
        # the kernels read fp32 / fp16 tables; a bf16 one (cast by a framework) goes through fp32, its
        # gradient back through the cast, rather than to the PyTorch reference (tens of times slower)
        params = params.float()
    unsupported = params.dtype not in (torch.float32, torch.float16) or params.shape[1] not in (1, 2, 4, 8)
    if unsupported or not _on_cuda(x, params):
        return hash_encode_torch(x, params, scales, resolutions, offsets)
    return _HashEncode.apply(
        x, params, [float(s) for s in scales], [int(r) for r in resolutions], [int(o) for o in offsets]
    )


class _SHEncode(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dirs: Tensor, degree: int) -> Tensor:
        ctx.save_for_backward(dirs)
        ctx.degree = degree
        return _ext().sh_encode_fwd(dirs, degree)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        (dirs,) = ctx.saved_tensors
        return _ext().sh_encode_bwd(dirs, g.float().contiguous(), ctx.degree), None


def sh_encode(dirs: Tensor, degree: int = 4) -> Tensor:
    """Real SH of unit directions float32 [N, 3] -> [N, degree^2] (tcnn order); differentiable w.r.t.
    the directions when they require it (learned camera poses turn them)."""
    if dirs.dtype != torch.float32 or not _on_cuda(dirs):
        return sh_encode_torch(dirs, degree)
    if dirs.requires_grad:
        return _SHEncode.apply(dirs.contiguous(), int(degree))
    return _ext().sh_encode_fwd(dirs.contiguous(), int(degree))
