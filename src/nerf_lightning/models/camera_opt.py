"""Learned camera poses: a small SE(3) correction per training view, trained with the field.

instant-ngp's "train extrinsics" and nerfstudio's camera optimizer. Photographs come with poses
estimated by structure from motion, which are off by a fraction of a pixel to a few pixels; the field
then blurs what the views disagree on. Each training view ``v`` gets six numbers
``x_v = (w_v, rho_v)``, zero at the start, and its rays are moved before marching (NGP space)::

    d' = R(w_v) d          the view's directions rotate about its camera centre
    o' = o + t_v           and the centre moves: t_v = rho_v (SO3xR3) or V(w_v) rho_v (SE3)

``R(w) = exp([w]x)`` is Rodrigues' formula, ``V(w)`` the left Jacobian of SO(3) (the translation of
the se(3) exponential); both in closed form with Taylor series near ``w = 0`` (exact to float64 there,
gradients finite at 0). The gradient reaches the corrections through the sample positions
``o' + t d'`` and the view directions ``d'`` that the field is evaluated at.

Gauge (drift): moving every camera by one similarity (rotation, translation, scale) and the scene with
it renders the same training images, so nothing in the loss fixes the frame the corrections live in,
and the cameras and the scene could drift together away from the frame of the given poses. Held-out
views are rendered with their *given* poses, in that frame, so drift would cost held-out PSNR. With
``gauge=similarity`` (default) the corrections applied are the raw ones with their best-fitting global
similarity removed: the 6V-vector of corrections is projected onto the orthogonal complement of the
7-dimensional subspace a small global similarity would produce (``w_v = w``,
``t_v = w x (c_v - c_mean) + tau + s (c_v - c_mean)`` for camera centres ``c_v``). To first order the
refined cameras then fit the given ones best in the least-squares sense, i.e. they stay in the given
poses' frame. L2 on the raw corrections (Adam's coupled ``weight_decay`` on their group, as
instant-ngp's ``extrinsic_l2_reg``) keeps poorly constrained corrections near zero.

Every transform is computed elementwise in float64 per view (no matmul: mixed-precision autocast
never sees it), then gathered per ray in float32: a few kernels of V elements and a gather of R rays,
captured with the rest of the training step in its CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Literal

import numpy as np
import torch
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Range
from nerf_lightning.models.per_view import Enabled, NViews, Photograph, ViewGroup, resolve_enabled
from nerf_lightning.training.clock import StepsOrFraction, steps_of
from nerf_lightning.training.lr_schedules import exponential_lr_factor

__all__ = ["CameraOptimizer", "so3_exp", "se3_left_jacobian_apply", "gauge_basis"]

#: ``model.net.camera_opt.mode``
Mode = Literal["SO3xR3", "SE3"]
#: ``model.net.camera_opt.gauge``
Gauge = Literal["similarity", "none"]
#: below this squared angle the Taylor series replace the closed forms (float64)
_SMALL = 1e-6


def _cross(a: Tensor, b: Tensor) -> Tensor:
    """a x b for [..., 3] (elementwise ops only)."""
    ax, ay, az = a.unbind(-1)
    bx, by, bz = b.unbind(-1)
    return torch.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], dim=-1)


def _coefficients(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``sin t / t``, ``(1 - cos t) / t^2``, ``(t - sin t) / t^3`` of ``t = |w|`` for w [..., 3], stable
    at 0 (value and gradient)."""
    t2 = (w * w).sum(-1, keepdim=True)
    small = t2 < _SMALL
    t2_safe = torch.where(small, torch.ones_like(t2), t2)  # keeps the unused branch's gradient finite
    t = t2_safe.sqrt()
    a_exact = torch.sin(t) / t
    b_exact = 2.0 * torch.sin(0.5 * t).square() / t2_safe  # 1 - cos t without cancellation
    c_exact = (1.0 - a_exact) / t2_safe
    a_series = 1.0 - t2 / 6.0 + t2 * t2 / 120.0
    b_series = 0.5 - t2 / 24.0 + t2 * t2 / 720.0
    c_series = 1.0 / 6.0 - t2 / 120.0 + t2 * t2 / 5040.0
    return (
        torch.where(small, a_series, a_exact),
        torch.where(small, b_series, b_exact),
        torch.where(small, c_series, c_exact),
    )


def so3_exp(w: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] of axis-angle vectors ``w`` [..., 3]: ``I + A K + B K^2`` with
    ``K = [w]x`` (Rodrigues), written without matrix products."""
    a, b, _ = _coefficients(w)
    t2 = (w * w).sum(-1, keepdim=True)
    wx, wy, wz = w.unbind(-1)
    zero = torch.zeros_like(wx)
    skew = torch.stack(
        [
            torch.stack([zero, -wz, wy], -1),
            torch.stack([wz, zero, -wx], -1),
            torch.stack([-wy, wx, zero], -1),
        ],
        dim=-2,
    )
    eye = torch.eye(3, dtype=w.dtype, device=w.device)
    # K^2 = w w^T - |w|^2 I
    k2 = w[..., :, None] * w[..., None, :] - t2[..., None] * eye
    return eye + a[..., None] * skew + b[..., None] * k2


def se3_left_jacobian_apply(w: Tensor, rho: Tensor) -> Tensor:
    """``V(w) rho`` = ``rho + B (w x rho) + C w x (w x rho)`` [..., 3]: the translation of
    ``exp((w, rho))`` in se(3)."""
    _, b, c = _coefficients(w)
    wr = _cross(w, rho)
    return rho + b * wr + c * _cross(w, wr)


def gauge_basis(centres: np.ndarray) -> np.ndarray:
    """Orthonormal basis [V, 6, 7] (columns; zero columns past the rank) of the corrections a small
    global similarity produces at cameras with ``centres`` [V, 3]: rotation ``w`` (3), translation
    ``tau`` (3) and scale ``s`` (1) about the centres' mean, in the layout ``x_v = (w_v, t_v)``."""
    c = np.asarray(centres, dtype=np.float64)
    r = c - c.mean(axis=0, keepdims=True)
    n = c.shape[0]
    g = np.zeros((n, 6, 7))
    for k in range(3):
        e = np.zeros(3)
        e[k] = 1.0
        g[:, k, k] = 1.0  # w_v = w
        g[:, 3:, k] = np.cross(e, r)  # t_v = w x r_v
        g[:, 3 + k, 3 + k] = 1.0  # t_v = tau
    g[:, 3:, 6] = r  # t_v = s r_v
    u, s, _ = np.linalg.svd(g.reshape(6 * n, 7), full_matrices=False)
    rank = int((s > 1e-9 * max(float(s.max()), 1e-30)).sum())
    basis = np.zeros((6 * n, 7))
    basis[:, :rank] = u[:, :rank]
    return basis.reshape(n, 6, 7)


class CameraOptimizer(nn.Module):
    """Per-training-view pose corrections (see the module docstring).

    Args:
        n_views: number of training views (from the capture; ``train`` hands it over).
        poses: float [V, 3, 4] NGP-space camera-to-world of the training views as given (their centres
            define the gauge); ``None`` when the module's state is loaded from a checkpoint next (the
            gauge basis is part of it).
        photograph: whether the capture is photographs (``enabled=auto``).
        enabled: ``true``, ``false`` or ``auto`` (on for photographs).
        mode: ``SO3xR3`` (rotation about the camera centre and a translation of it, nerfstudio's
            recommended mode) or ``SE3`` (the se(3) exponential: the translation turns with ``w``).
        gauge: ``similarity`` (remove the corrections' best-fitting global similarity) or ``none``.
        lr: Adam learning rate of the corrections (instant-ngp and nerfacto: 1e-3).
        lr_final: learning rate after ``decay_steps`` (log-linear decay, then constant; nerfacto: 1e-4).
        decay_steps: length of the decay, a fraction of the run (<= 1) or a step count.
        warmup_steps: the learning rate ramps linearly from 0 over this many steps (fraction or count;
            0: none), so that the first, still random field does not push the cameras.
        weight_decay: coupled L2 of the raw corrections (Adam's ``weight_decay`` on their group).
    """

    def __init__(
        self,
        n_views: NViews,
        poses: Annotated[Tensor | None, Injected("NeRFModule: the training views' given poses")] = None,
        photograph: Photograph = False,
        enabled: Enabled = False,
        mode: Mode = "SO3xR3",
        gauge: Gauge = "similarity",
        lr: Annotated[float, Range(above=0)] = 1e-3,
        lr_final: Annotated[float, Range(above=0)] = 1e-4,
        decay_steps: StepsOrFraction = 0.25,
        warmup_steps: StepsOrFraction = 0.0,
        weight_decay: Annotated[float, Range(low=0)] = 1e-4,
    ) -> None:
        super().__init__()
        check_arguments(CameraOptimizer, locals())
        self.enabled = resolve_enabled(enabled, photograph)
        if self.enabled and n_views < 1:
            raise ValueError(
                f"model.net.camera_opt: needs the number of training views (>= 1), got {n_views}"
            )
        if poses is not None and tuple(poses.shape) != (n_views, 3, 4):
            raise ValueError(
                f"model.net.camera_opt: poses must be [{n_views}, 3, 4], got {tuple(poses.shape)}"
            )
        self.n_views = int(n_views)
        self.mode, self.gauge_mode = mode, gauge
        self.lr, self.lr_final = float(lr), float(lr_final)
        self.decay_steps, self.warmup_steps = float(decay_steps), float(warmup_steps)
        self.weight_decay = float(weight_decay)
        n = max(self.n_views, 0)
        #: raw corrections [V, 6] = (w, rho): axis-angle (radians) and translation (NGP units)
        self.adjustment = nn.Parameter(torch.zeros(n, 6))
        basis = np.zeros((n, 6, 7))
        if poses is not None and gauge == "similarity" and n > 0:
            basis = gauge_basis(poses[:, :3, 3].detach().double().cpu().numpy())
        # float64: the projection is a difference of nearly equal numbers when the corrections are
        # mostly gauge; saved in the state dict (eval and render rebuild the module without poses)
        self.register_buffer("gauge", torch.from_numpy(basis).to(torch.float64))

    # ------------------------------------------------------------------------------ the corrections
    def corrections(self) -> Tensor:
        """The corrections applied, float64 [V, 6] = (w, rho): the raw ones minus their projection on
        the gauge subspace (``gauge=similarity``)."""
        x = self.adjustment.double()
        if self.gauge_mode == "none":
            return x
        coeff = (self.gauge * x[:, :, None]).sum(dim=(0, 1))  # [7]
        return x - (self.gauge * coeff).sum(-1)

    def transforms(self) -> tuple[Tensor, Tensor]:
        """Per view: rotation float32 [V, 3, 3] (applied to directions, about the camera centre) and
        translation float32 [V, 3] (added to the centre)."""
        with torch.autocast(self.adjustment.device.type, enabled=False):
            x = self.corrections()
            w, rho = x[:, :3], x[:, 3:]
            rot = so3_exp(w)
            trans = rho if self.mode == "SO3xR3" else se3_left_jacobian_apply(w, rho)
            return rot.float(), trans.float()

    def forward(self, view_ids: Tensor, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, Tensor]:
        """Corrected rays: ``(o + t_v, R_v d)`` for rays float32 [R, 3] of views ``view_ids`` int64 [R]."""
        rot, trans = self.transforms()
        with torch.autocast(rays_d.device.type, enabled=False):
            # index_select: its backward is one scatter-add (advanced indexing would sort the indices)
            r = rot.index_select(0, view_ids)  # [R, 3, 3]
            rays_d = (r * rays_d[:, None, :]).sum(-1)
            rays_o = rays_o + trans.index_select(0, view_ids)
        return rays_o, rays_d

    @torch.no_grad()
    def refined_poses(self, poses: Tensor) -> Tensor:
        """The corrected camera-to-world [V, 3, 4] (float64) of the given poses [V, 3, 4] (NGP space)."""
        rot, trans = self.transforms()
        p = poses.detach().double().to(rot.device)
        out = p.clone()
        out[:, :, :3] = (rot.double()[:, :, :, None] * p[:, None, :, :3]).sum(-2)
        out[:, :, 3] = p[:, :, 3] + trans.double()
        return out

    @torch.no_grad()
    def summary(self) -> dict[str, float]:
        """Sizes of the corrections applied (metrics.json): rotation in degrees, translation in NGP units."""
        x = self.corrections()
        rot = x[:, :3].norm(dim=-1) * (180.0 / math.pi)
        trans = x[:, 3:].norm(dim=-1)
        return {
            "camera_opt/rotation_deg_mean": float(rot.mean()),
            "camera_opt/rotation_deg_max": float(rot.max()),
            "camera_opt/translation_mean": float(trans.mean()),
            "camera_opt/translation_max": float(trans.max()),
        }

    # ------------------------------------------------------------------------------- optimization
    def lr_factor(self, total_steps: int) -> Callable[[int], float]:
        """The group's learning-rate factor per optimizer step (linear warm-up, log-linear decay)."""
        decay = exponential_lr_factor(self.lr, self.lr_final, self.decay_steps, total_steps)
        warmup = steps_of(self.warmup_steps, total_steps) if self.warmup_steps > 0 else 0.0

        def factor(step: int) -> float:
            ramp = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
            return ramp * decay(step)

        return factor

    def parameter_group(self, total_steps: int) -> ViewGroup:
        return ViewGroup(
            "camera_opt", [self.adjustment], self.lr, self.weight_decay, self.lr_factor(total_steps)
        )

    def extra_repr(self) -> str:
        return f"n_views={self.n_views}, mode={self.mode}, gauge={self.gauge_mode}"
