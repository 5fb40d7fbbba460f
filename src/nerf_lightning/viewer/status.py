"""What the viewer's training panel shows (``panels.py`` draws it): plain data, no viser, so that the
training callback (``callback.py``) imports without the viewer's packages until a viewer starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nerf_lightning.utils.units import si_number

__all__ = ["TrainingStatus"]


@dataclass(frozen=True)
class TrainingStatus:
    """What the training panel shows (None: not known yet)."""

    step: int
    max_steps: int | None = None
    loss: float | None = None
    val_psnr: float | None = None
    rays_per_s: float | None = None
    state: str = "training"  # training | paused | stopping | finished
    #: before the first validation: the PSNR of the latest logged training batch, and the step at
    #: which the first held-out PSNR comes
    train_psnr: float | None = None
    first_val_step: int | None = None

    def markdown(self) -> str:
        def num(v: float | None, fmt: str) -> str:
            return "–" if v is None or not math.isfinite(v) else format(v, fmt)

        steps = f"{self.step:,}" + (f" / {self.max_steps:,}" if self.max_steps else "")
        rays = "–" if self.rays_per_s is None else si_number(self.rays_per_s)  # as the progress bar
        if self.val_psnr is not None or self.first_val_step is None:
            psnr = f"held-out PSNR {num(self.val_psnr, '.2f')} dB"
        else:  # validation may be minutes away: say when, and show the training batches' PSNR meanwhile
            psnr = f"held-out PSNR at step {self.first_val_step:,}"
            if self.train_psnr is not None and math.isfinite(self.train_psnr):
                psnr = f"training PSNR {self.train_psnr:.2f} dB ({psnr})"
        return f"**{self.state}** · step {steps}  \nloss {num(self.loss, '.5f')} · {psnr}  \nrays/s {rays}"
