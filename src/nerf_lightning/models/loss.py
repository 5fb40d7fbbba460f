"""The training loss's kind and weights: the ``model.net.loss`` config node, read by the training step."""

from __future__ import annotations

from typing import Annotated, Literal

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Formerly, Note, Range

__all__ = ["RENDER_ALPHA_WEIGHT", "AlphaWeight", "StepLoss"]

#: ``alpha_weight=auto`` on renders: trained over white (the render recipe until 2026-12-07), lego over
#: black gained 7.4 dB at 20k steps for no loss over white
#: (docs/investigations/2026-12-03-empty-space-in-renders.md); photographs have no transparent pixels to
#: learn from.
RENDER_ALPHA_WEIGHT = 0.1

#: the opacity loss's weight, or ``auto`` (:meth:`StepLoss.resolved`)
AlphaWeight = Annotated[float | Literal["auto"], Range(low=0), Note("auto: 0.1 on renders, 0 on photographs")]


class StepLoss:
    """What the training step minimizes: the photometric loss per ray (mean over the channels), plus
    optional weighted terms (``models/train_step.py``).

    Args:
        kind: ``huber`` (instant-ngp's NeRF default) or ``mse``.
        huber_delta: the Huber loss's delta (``kind=huber``).
        distortion_weight: weight of mip-NeRF 360's distortion loss (mean over the rays); 0 leaves it out.
        alpha_weight: weight of the opacity loss, the mean over the rays of ``(opacity - alpha)^2``
            against the training images' alpha (captures whose images carry alpha only). 0 (off) by
            default: random training backgrounds already charge faint density in empty space. ``auto``:
            :data:`RENDER_ALPHA_WEIGHT` for renders, 0 for photographs (:meth:`resolved`).
    """

    def __init__(
        self,
        kind: Annotated[Literal["huber", "mse"], Formerly("model.loss")] = "huber",
        huber_delta: Annotated[float, Range(above=0), Formerly("model.huber_delta")] = 0.1,
        distortion_weight: Annotated[float, Range(low=0), Formerly("model.distortion_weight")] = 0.0,
        alpha_weight: Annotated[AlphaWeight, Formerly("model.alpha_weight")] = 0.0,
    ) -> None:
        check_arguments(StepLoss, locals())
        self.kind = kind
        self.huber_delta = float(huber_delta)
        self.distortion_weight = float(distortion_weight)
        self.alpha_weight: float | str = alpha_weight if alpha_weight == "auto" else float(alpha_weight)

    def resolved(self, photograph: bool) -> StepLoss:
        """This loss with ``alpha_weight=auto`` decided for a capture of photographs or renders."""
        if self.alpha_weight != "auto":
            return self
        weight = 0.0 if photograph else RENDER_ALPHA_WEIGHT
        return StepLoss(self.kind, self.huber_delta, self.distortion_weight, weight)

    def __repr__(self) -> str:
        return (
            f"StepLoss(kind={self.kind!r}, huber_delta={self.huber_delta}, "
            f"distortion_weight={self.distortion_weight}, alpha_weight={self.alpha_weight!r})"
        )
