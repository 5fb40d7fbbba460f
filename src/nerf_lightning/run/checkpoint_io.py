"""Checkpoint files: atomic writes, weights-only reads with errors a user can act on.

Writing: ``torch.save`` into memory, then a temporary file in the same folder, ``fsync`` and
``os.replace`` (``utils.io.atomic_write_bytes``): a reader, or a process killed at any moment of the
write, sees either the complete previous file or the complete new one, never a truncated file.

Reading: always ``torch.load(weights_only=True)`` (checkpoints hold plain data only, see
``run/checkpoint_callbacks.py``); a missing, truncated or foreign file raises :class:`UserError`
naming the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from nerf_lightning.errors import UserError
from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["AtomicCheckpointIO", "read_checkpoint"]


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; :class:`UserError` when the file cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file; expected a .ckpt written by nerf_lightning.train")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{path}: holds Python objects a weights-only load refuses ({first}); it was written by "
            "an older nerf_lightning (before checkpoints held plain data): retrain, or load it once with "
            "torch.load(weights_only=False) if you trust it and re-save its state_dict"
        ) from err
    except (RuntimeError, EOFError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(
            f"{path}: not a readable checkpoint ({reason}); "
            "expected a complete .ckpt file (a copy still in progress?)"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise UserError(f"{path}: not a Lightning checkpoint (no `state_dict`)")
    return ckpt


class AtomicCheckpointIO(TorchCheckpointIO):
    """Atomic ``save_checkpoint`` (a crash never corrupts ``last.ckpt``); weights-only ``load_checkpoint``."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if weights_only is False:  # an explicit request of the caller
            return super().load_checkpoint(path, map_location=map_location, weights_only=False)
        return read_checkpoint(path, map_location=map_location or (lambda storage, loc: storage))
