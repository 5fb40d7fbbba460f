"""Per-image exposure: a learned colour gain (and optional offset) per training view.

instant-ngp's exposure optimisation. A phone's auto-exposure and white balance change from frame to
frame; a field trained on such images has to average the frames' brightness, or explains each frame's
exposure with view-dependent colour and floaters. Each training view ``v`` gets a log-gain per colour
channel ``g_v`` [3] (and, with ``bias=true``, an additive offset ``b_v`` [3]), zero at the start, applied
to the scene's radiance before the background is composited::

    rgb_v = exp(g_v) * S + b_v * alpha + (1 - alpha) * background

where ``S = sum_i w_i c_i`` is the rendered scene colour and ``alpha = sum_i w_i`` its opacity (so a
ray that sees only background keeps the background, whatever the view's exposure). With the renderer's
composited ``rgb = S + (1 - alpha) * background`` this is
``exp(g_v) * rgb + (1 - exp(g_v)) * (1 - alpha) * background + b_v * alpha``: it needs only the
rendered colour and opacity, no per-sample work.

Gauge: a gain common to all views is the field's own colour, so the gains and offsets applied are the
raw ones minus their mean over the training views (instant-ngp renormalizes its exposures to mean 0 the
same way). The neutral exposure ``g = 0, b = 0`` is then the training views' geometric-mean exposure;
held-out views (validation, ``eval``), rendered camera paths (``render``) and the viewer use it, i.e.
they are rendered by the field alone, with nothing applied and no information from the held-out images.
A training view evaluated as such (``data.val_split=train``, ``eval split=train``) is rendered with its
own learned exposure.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.models.per_view import Enabled, NViews, Photograph, ViewGroup, resolve_enabled

__all__ = ["PerViewExposure"]


class PerViewExposure(nn.Module):
    """Per-training-view colour gain (and offset) applied to rendered colours (see the module docstring).

    Args:
        n_views: number of training views (from the capture; ``train`` hands it over).
        photograph: whether the capture is photographs (``enabled=auto``).
        enabled: ``true``, ``false`` or ``auto`` (on for photographs).
        bias: also learn an additive offset per view and channel.
        lr: Adam learning rate; ``None``: the optimizer's, following the main schedule (instant-ngp
            trains its exposures with the network's learning rate).
        weight_decay: coupled L2 of the raw gains and offsets (Adam's ``weight_decay``; instant-ngp:
            0).
    """

    def __init__(
        self,
        n_views: NViews,
        photograph: Photograph = False,
        enabled: Enabled = False,
        bias: bool = False,
        lr: Annotated[
            float | None, Range(above=0), Note("null: the field's learning rate and schedule")
        ] = None,
        weight_decay: Annotated[float, Range(low=0)] = 0.0,
    ) -> None:
        super().__init__()
        check_arguments(PerViewExposure, locals())
        self.enabled = resolve_enabled(enabled, photograph)
        if self.enabled and n_views < 1:
            raise ValueError(
                f"model.net.appearance: needs the number of training views (>= 1), got {n_views}"
            )
        self.n_views = int(n_views)
        self.lr = None if lr is None else float(lr)
        self.weight_decay = float(weight_decay)
        n = max(self.n_views, 0)
        #: raw log-gains [V, 3] (natural log, per RGB channel)
        self.log_gain = nn.Parameter(torch.zeros(n, 3))
        #: raw additive offsets [V, 3] (``bias=true``), else None
        self.offset = nn.Parameter(torch.zeros(n, 3)) if bias else None

    def gains(self) -> Tensor:
        """The gains applied, float32 [V, 3] (``exp`` of the zero-mean log-gains)."""
        g = self.log_gain
        return torch.exp(g - g.mean(dim=0, keepdim=True))

    def offsets(self) -> Tensor | None:
        """The offsets applied, float32 [V, 3] (zero-mean), or None without ``bias``."""
        if self.offset is None:
            return None
        return self.offset - self.offset.mean(dim=0, keepdim=True)

    def forward(self, view_ids: Tensor, rgb: Tensor, opacity: Tensor, background: Tensor | None) -> Tensor:
        """Colours [R, 3] of rays of views ``view_ids`` int64 [R] under their views' exposure.

        Args:
            view_ids: the rays' training views.
            rgb: rendered colour [R, 3] (over ``background``).
            opacity: [R, 1].
            background: [R, 3], [3] or None (black), what ``rgb`` was composited over.
        """
        gain = self.gains().index_select(0, view_ids)  # backward: one scatter-add
        alpha = opacity.to(rgb.dtype)
        out = gain * rgb
        if background is not None:
            out = out + (1.0 - gain) * (1.0 - alpha) * background
        offsets = self.offsets()
        if offsets is not None:
            out = out + offsets.index_select(0, view_ids) * alpha
        return out

    @torch.no_grad()
    def summary(self) -> dict[str, float]:
        """Spread of the learned exposures (metrics.json): the gains' range in stops (log2)."""
        stops = (self.log_gain - self.log_gain.mean(dim=0, keepdim=True)) / math.log(2.0)
        return {
            "appearance/stops_min": float(stops.min()),
            "appearance/stops_max": float(stops.max()),
            "appearance/stops_std": float(stops.std()) if stops.numel() > 1 else 0.0,
        }

    def parameter_group(self, total_steps: int) -> ViewGroup:
        params = [self.log_gain] + ([self.offset] if self.offset is not None else [])
        return ViewGroup("appearance", params, self.lr, self.weight_decay, None)

    def extra_repr(self) -> str:
        return f"n_views={self.n_views}, bias={self.offset is not None}"
