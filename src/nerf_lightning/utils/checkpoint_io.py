"""Checkpoint IO that writes to a temporary file in the same folder and renames it into place."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from nerf_lightning.utils.io import atomic_write_bytes


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into memory, then an atomic replace: a crash never corrupts ``last.ckpt``."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Any = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        # A run's own checkpoints hold the hyperparameters Hydra built (partial factories, configs), which
        # torch.load's default weights_only=True refuses: resuming (ckpt_path=..., SLURM requeue) needs the
        # full unpickler. Pass weights_only=True explicitly for files of unknown origin.
        return super().load_checkpoint(
            path, map_location=map_location, weights_only=False if weights_only is None else weights_only
        )
