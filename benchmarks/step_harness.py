"""The training step of a config's model outside Lightning, for the step's benchmarks
(``benchmarks.step_scaling``, ``benchmarks.census``)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

#: steps between two occupancy updates (instant-ngp's, the grid's default)
GRID_EVERY = 16


class BudgetedStep:
    """The training step of ``cfg``'s model at ``scale`` x the configured batch, outside Lightning.

    ``step(i)`` draws a batch and runs the budgeted step (each replayed from its CUDA graph on a GPU, as
    training does), steps fused Adam and updates the occupancy grid every 16 calls; returns the step's
    stats (``TrainStep``).
    """

    def __init__(self, cfg: Any, dm: Any, precision: str, scale: float = 1.0, device: str = "cuda") -> None:
        from nerf_lightning.apps.train import build_model
        from nerf_lightning.models.train_step import capture

        self.device = torch.device(device)
        self.dm, self.precision = dm, precision
        self.model = build_model(cfg, dm)[0].to(self.device)  # as the train app: the capture's seams
        self.fn = self.model.train_step_fn
        if not self.fn.budgeted:
            raise ValueError("bench: the step needs a sample budget (model.net.step.sample_budget is null)")
        self.fn.to(self.device)
        self.fn.set_capacity_scale(scale)
        self.n_rays = max(1, int(dm.batch_size * scale))
        fused = self.device.type == "cuda"
        self.opt = torch.optim.Adam(
            self.model.parameters(), lr=1e-2, eps=1e-15, betas=(0.9, 0.99), fused=fused
        )
        self.graphed = self.device.type == "cuda"
        if self.graphed:  # the step's graph reads the batch graph's buffers, as in training
            self.fn = capture(self.fn, dm.draw(self.n_rays), precision, share_inputs=True)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.graphed and precision == "16-mixed")

    def forward_backward(self) -> torch.Tensor:
        """Draw a batch, run the step and its backward; the gradients are left in ``.grad``."""
        from nerf_lightning.models.train_step import autocast_for

        b = self.dm.draw(self.n_rays)
        with autocast_for(self.precision) if self.graphed else nullcontext():
            loss, _, _, stats = self.fn(b)
        self.scaler.scale(loss).backward()
        return stats

    def step(self, i: int, update: bool = True) -> torch.Tensor:
        stats = self.forward_backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        if update and i % GRID_EVERY == 0:
            self.update_grid(i + 300)
        return stats

    def update_grid(self, step: int, ranks: int = 1) -> None:
        """The occupancy update after warm-up, with rank 0's share of the cells of ``ranks`` ranks."""
        self.model.occupancy.update(step, self.model.field.density, warmup_steps=256, share=(0, ranks))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def gradient_census(self) -> dict[str, Any]:
        """One step's gradient: its bytes, and the hash-table rows it touches (overall and per level)."""
        stats = self.forward_backward()
        self.sync()
        encoding = self.model.field.encoding
        grad = encoding.params.grad
        touched = (grad != 0).any(dim=-1)
        offsets = encoding.offsets
        per_level = [
            float(touched[a:b].float().mean()) for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        ]
        params = list(self.model.parameters())
        table_rows = int(encoding.params.shape[0])
        out = {
            "grad_bytes": sum(p.numel() * p.element_size() for p in params),
            "table_bytes": encoding.params.numel() * encoding.params.element_size(),
            "table_rows": table_rows,
            "table_features": int(encoding.params.shape[1]),
            "touched_fraction": float(touched.float().mean()),
            "touched_per_level": per_level,
            "level_rows": [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)],
            "rays": float(stats[0]),
        }
        self.opt.zero_grad(set_to_none=True)
        return out
