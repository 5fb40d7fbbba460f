"""Per-rank state digests, to check from outside that the ranks of a multi-process run agree.

``debug=rank_state`` adds this callback. At the end of training every rank writes
``<run dir>/rank_state/rank<r>.json``:

- ``rank``, ``local_rank``, ``node_rank``, ``world_size``, ``cluster_environment`` (the Lightning class
  that assigned them), ``global_step``, ``run_dir`` (this rank's ``trainer.default_root_dir``);
- ``occupancy``: SHA-256 of the occupancy grid's ``density_grid`` and ``binaries`` and the occupied
  fraction; under DDP the grid is all-reduced after each update, so the digests must be equal;
- ``parameters``: SHA-256 over every parameter (DDP keeps them identical).

Digests cover the exact bytes, so equal digests mean bit-identical state. The file is written
atomically; with ranks sharing one run directory there is one file per rank.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import lightning as L
import torch

from nerf_lightning.utils.io import atomic_write_json


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
    """

    def __init__(self, dirname: str = "rank_state") -> None:
        self.dirname = dirname

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
