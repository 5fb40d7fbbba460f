"""Per-rank state digests, to check from outside that the ranks of a multi-process run agree.

``debug=rank_state`` adds this callback. At the end of training every rank writes
``<run dir>/rank_state/rank<r>.json``:

- ``rank``, ``local_rank``, ``node_rank``, ``world_size``, ``cluster_environment`` (the Lightning class
  that assigned them), ``global_step``, ``run_dir`` (this rank's ``trainer.default_root_dir``);
- ``occupancy``: SHA-256 of the occupancy grid's ``density_grid`` and ``binaries`` and the occupied
  fraction; under DDP the grid is all-reduced after each update, so the digests must be equal;
- ``parameters``: SHA-256 over every parameter (DDP keeps them identical);
- ``sampler``: SHA-256 of the ray sampler's view probabilities (all-reduced statistics: equal);
- ``first_batch``: SHA-256 of this rank's first training rays (per-rank seeds: must differ);
- ``checks``: how many times, inside the run, the ranks compared checksums of their grid, sampler
  and parameters (every ``check_every_n_steps`` optimizer steps) and found them equal; a
  difference stops the run with an error naming the step and the state.

Digests cover the exact bytes, so equal digests mean bit-identical state. The file is written
atomically; with ranks sharing one run directory there is one file per rank.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import lightning as L
import torch

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Note, Range
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.utils.io import atomic_write_json

#: What the in-run check compares, in the order of :func:`_checksums`.
CHECKED = ("occupancy density", "occupancy bitfield", "sampler", "parameters")


def _checksums(pl_module: L.LightningModule, feedback: TrainingFeedback | None) -> torch.Tensor:
    """float64 [4] position-weighted sums: equal state gives equal sums; the slightest change moves them."""

    def weighted(t: torch.Tensor) -> torch.Tensor:
        flat = t.detach().reshape(-1).to(torch.float64)
        return (flat * torch.linspace(1.0, 2.0, flat.numel(), device=flat.device, dtype=torch.float64)).sum()

    grid = pl_module.occupancy
    sampler = feedback.sampler if feedback is not None else None
    probs = sampler.view_probs if sampler is not None else torch.zeros(1, device=pl_module.device)
    params = torch.stack([weighted(p) for p in pl_module.parameters()]).sum()
    return torch.stack([weighted(grid.density_grid), weighted(grid.binaries), weighted(probs), params]).to(
        pl_module.device
    )


def tensor_digest(*tensors: torch.Tensor) -> str:
    """SHA-256 of the tensors' raw bytes (dtype and shape included), in order."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class RankStateDump(L.Callback):
    """Write this rank's state digests at the end of training (see the module docstring).

    Args:
        dirname: sub-folder of the run directory for the ``rank<r>.json`` files.
        check_every_n_steps: optimizer steps between two in-run comparisons (0: none).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback` (the train
            app passes it), whose ray sampler is digested. None: no sampler digest.
    """

    def __init__(
        self,
        dirname: str = "rank_state",
        check_every_n_steps: Annotated[int, Range(low=0), Note("0: no cross-rank check")] = 0,
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
    ) -> None:
        check_arguments(RankStateDump, locals())
        self.dirname = dirname
        self.feedback = feedback
        self.check_every_n_steps = int(check_every_n_steps)
        self.checks = 0
        self._first_batch: str | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        # a training batch (``data/ray_batch.py``'s RayBatch) has rays; other batches are not digested
        rays_o, rays_d = getattr(batch, "rays_o", None), getattr(batch, "rays_d", None)
        if self._first_batch is None and rays_o is not None and rays_d is not None:
            self._first_batch = tensor_digest(rays_o, rays_d)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if self.check_every_n_steps <= 0 or trainer.world_size <= 1 or step % self.check_every_n_steps:
            return
        local = _checksums(pl_module, self.feedback)
        gathered = trainer.strategy.all_gather(local).reshape(trainer.world_size, -1).cpu()
        differ = [
            name for i, name in enumerate(CHECKED) if not bool((gathered[:, i] == gathered[0, i]).all())
        ]
        if differ:
            raise RuntimeError(
                f"ranks disagree at step {step} on: {', '.join(differ)} (checksums {gathered})"
            )
        self.checks += 1

    def state(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        env = getattr(trainer.strategy, "cluster_environment", None)
        record: dict[str, Any] = {
            "rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "cluster_environment": type(env).__name__ if env is not None else None,
            "global_step": trainer.global_step,
            "run_dir": str(Path(trainer.default_root_dir).resolve()),
            "parameters": tensor_digest(*(p for _, p in sorted(pl_module.named_parameters()))),
        }
        sampler = self.feedback.sampler if self.feedback is not None else None
        if sampler is not None:
            record["sampler"] = tensor_digest(sampler.view_probs)
        record["first_batch"] = self._first_batch
        record["checks"] = self.checks
        grid = getattr(pl_module, "occupancy", None)
        if grid is not None:
            record["occupancy"] = {
                "density_grid": tensor_digest(grid.density_grid),
                "binaries": tensor_digest(grid.binaries),
                "occupied_fraction": float(grid.binaries.float().mean()),
            }
        return record

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(trainer.default_root_dir) / self.dirname / f"rank{trainer.global_rank}.json"
        atomic_write_json(path, self.state(trainer, pl_module))
