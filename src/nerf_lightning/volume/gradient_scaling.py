"""Near-camera gradient scaling ("Floaters No More", Philip & Deschaintre, EGSR 2023).

A volume close to a camera is crossed by many of that camera's rays and by few rays of any other
view, so it receives a large share of the gradient while being constrained by one view only: the
optimizer can explain a training image with density just in front of its own camera (a floater)
before the shared geometry forms. Scaling the gradient of every sample's density and colour by
``min(1, (t / distance)^2)`` (``t``: the sample's distance from the ray origin) compensates the
quadratic growth of ray density towards the camera; forward values are unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["scale_near_gradients", "near_gradient_scale"]


def near_gradient_scale(t_starts: Tensor, t_ends: Tensor, distance: float) -> Tensor:
    """``min(1, (t_mid / distance)^2)`` per sample, float32 [S] (``t_mid``: the sample's midpoint;
    ``distance`` > 0, checked where it is configured, ``Renderer``). Three kernels in the step."""
    return ((t_starts + t_ends).float() * (0.5 / distance)).square().clamp_max(1.0)


class _ScaleGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sigmas: Tensor, rgbs: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        ctx.save_for_backward(scale)
        return sigmas.view_as(sigmas), rgbs.view_as(rgbs)

    @staticmethod
    def backward(ctx, grad_sigmas: Tensor, grad_rgbs: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        (scale,) = ctx.saved_tensors
        return (
            grad_sigmas * scale.to(grad_sigmas.dtype),
            grad_rgbs * scale.to(grad_rgbs.dtype)[:, None],
            None,
        )


def scale_near_gradients(
    sigmas: Tensor, rgbs: Tensor, t_starts: Tensor, t_ends: Tensor, distance: float
) -> tuple[Tensor, Tensor]:
    """Identity on ``sigmas`` [S] and ``rgbs`` [S, 3]; their gradients are multiplied per sample by
    :func:`near_gradient_scale` (samples at or beyond ``distance`` keep their gradient).

    Args:
        sigmas: densities of the packed samples (any float dtype).
        rgbs: colours of the packed samples.
        t_starts, t_ends: the samples' intervals along their (unit-direction) rays, NGP units.
        distance: distance from the camera (NGP units) from which gradients are left unscaled.
    """
    scale = near_gradient_scale(t_starts, t_ends, distance)
    return _ScaleGradients.apply(sigmas, rgbs, scale)
