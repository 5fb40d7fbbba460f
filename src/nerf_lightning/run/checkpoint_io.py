"""Checkpoint files: atomic writes, weights-only reads with errors a user can act on.

Writing: ``torch.save`` into memory, then a temporary file in the same folder, ``fsync`` and
``os.replace`` (``utils.io.atomic_write_bytes``): a reader, or a process killed at any moment of the
write, sees either the complete previous file or the complete new one, never a truncated file.

Reading: always ``torch.load(weights_only=True)`` (checkpoints hold plain data only, see
``run/checkpoint_callbacks.py``); a missing, truncated or foreign file raises :class:`UserError`
naming the file (a file that is no PyTorch checkpoint at all is said to be one, with no advice to load
it unguarded). Every read checks the weights too (:func:`check_finite`, the divergence guard's scan):
the writer never stores NaN/inf weights, so a file that holds them did not come from a healthy run, and
no app (training's resume, eval, render, export, view) may run on it.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from nerf_lightning.errors import Diverged, UserError
from nerf_lightning.run.divergence import first_names, non_finite
from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["AtomicCheckpointIO", "check_finite", "read_checkpoint"]


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; :class:`UserError` when the file cannot be used, its
    weights included (:func:`check_finite`).

    The file is looked at before it is unpickled: a checkpoint is a zip archive holding a pickle
    (``<name>/data.pkl``), so any other file (text, a random binary, another archive) is "not a
    nerf_lightning checkpoint", never a file to load without the weights-only guard.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file; expected a .ckpt written by nerf_lightning.train")
    _check_container(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UserError(_objects_message(path)) from err
    except Exception as err:  # noqa: BLE001 - a damaged archive raises whatever its parser meets
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise UserError(
            f"{path}: not a readable checkpoint ({type(err).__name__}: {reason}); "
            "expected a complete .ckpt file (a copy still in progress?)"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise UserError(
            f"{path}: not a nerf_lightning checkpoint (a PyTorch file without a Lightning `state_dict`); "
            "expected a .ckpt written by nerf_lightning.train"
        )
    check_finite(path, ckpt)
    return ckpt


def check_finite(path: str | Path, checkpoint: dict[str, Any]) -> None:
    """:class:`UserError` naming ``path`` and its first non-finite tensors when a weight of
    ``checkpoint["state_dict"]`` is NaN or infinite."""
    state = checkpoint.get("state_dict")
    bad = non_finite(list(state.items())) if isinstance(state, dict) else []
    if bad:
        raise UserError(
            f"{path}: NaN/inf in its weights ({first_names(bad)}); expected finite weights (training never "
            "saves a diverged state): use an earlier checkpoint of that run, or train it again"
        )


def _check_container(path: Path) -> None:
    """:class:`UserError` unless ``path`` is a (complete) PyTorch zip archive."""
    with path.open("rb") as f:
        head = f.read(4)
    if not head:
        raise UserError(f"{path}: an empty file, not a readable checkpoint (a copy still in progress?)")
    if not zipfile.is_zipfile(path):
        if head == b"PK\x03\x04":  # a zip archive whose end is missing
            raise UserError(
                f"{path}: not a readable checkpoint (truncated or damaged archive); "
                "expected a complete .ckpt file (a copy still in progress?)"
            )
        raise UserError(
            f"{path}: not a nerf_lightning checkpoint (not a PyTorch checkpoint file at all); "
            "expected a .ckpt written by nerf_lightning.train"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise UserError(f"{path}: not a readable checkpoint ({err}); expected a complete .ckpt file") from err
    if not any(n.endswith("/data.pkl") for n in names):
        raise UserError(
            f"{path}: not a nerf_lightning checkpoint (a zip archive, not a PyTorch checkpoint); "
            "expected a .ckpt written by nerf_lightning.train"
        )


def _objects_message(path: Path) -> str:
    """Why a weights-only load refused ``path``, read from its pickle without running it."""
    globals_, lightning = _pickle_globals(path)
    objects = [g for g in globals_ if not g.startswith(("torch.", "collections.", "_codecs."))]
    what = f" ({', '.join(objects[:2])})" if objects else ""
    if lightning:
        return (
            f"{path}: a Lightning checkpoint holding Python objects{what} that a weights-only load refuses; "
            "nerf_lightning's checkpoints hold plain data only, so another program or an older "
            "nerf_lightning wrote it: train again with this version"
        )
    return (
        f"{path}: not a nerf_lightning checkpoint (a PyTorch file holding Python objects{what} that a "
        "weights-only load refuses); expected a .ckpt written by nerf_lightning.train"
    )


def _pickle_globals(path: Path) -> tuple[list[str], bool]:
    """The classes/functions a checkpoint's pickle names, and whether it carries Lightning's version key.

    ``pickletools.genops`` only parses the opcodes: nothing is imported or run."""
    import pickletools

    found: list[str] = []
    lightning = False
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            data = archive.read(name)
        strings: list[str] = []
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and isinstance(arg, str):
                found.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
                lightning = lightning or arg == "pytorch-lightning_version"
    except Exception:  # noqa: BLE001 - a description only; the caller reports the refusal anyway
        pass
    return list(dict.fromkeys(found)), lightning


class AtomicCheckpointIO(TorchCheckpointIO):
    """Atomic ``save_checkpoint`` (a crash never corrupts ``last.ckpt``); weights-only ``load_checkpoint``.

    A checkpoint whose weights are not finite is never written (:class:`Diverged` instead). The
    ``DivergenceGuard`` checks the weights before every checkpoint through ``on_save_checkpoint``, but
    Lightning calls no callback's hook for a weights-only checkpoint (``save_weights_only=true``):
    this check is the one that holds for every file."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        bad = non_finite(list((checkpoint.get("state_dict") or {}).items()))
        if bad:
            step = checkpoint.get("global_step", "?")
            raise Diverged(
                f"training diverged: NaN/inf in {first_names(bad)} at step {step} ({path} was not "
                "written); lower the learning rate (model.optimizer.lr)"
            )
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def __init__(self) -> None:
        super().__init__()
        self._read: tuple[Path, dict[str, Any]] | None = None

    def hand_over(self, path: str | Path, checkpoint: dict[str, Any]) -> None:
        """The next load of ``path`` returns ``checkpoint``, which the caller has read and checked
        already (:func:`read_checkpoint`), instead of reading the file a second time."""
        self._read = (Path(path).resolve(), checkpoint)

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if self._read is not None and self._read[0] == Path(path).resolve():
            checkpoint, self._read = self._read[1], None
            return checkpoint
        if weights_only is False:  # an explicit request of the caller
            return super().load_checkpoint(path, map_location=map_location, weights_only=False)
        return read_checkpoint(path, map_location=map_location or (lambda storage, loc: storage))
