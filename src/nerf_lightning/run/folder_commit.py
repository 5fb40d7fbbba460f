"""A command writes into its run folder only once its checks have passed.

Hydra writes ``.hydra/`` (the config, the command's overrides) and opens the job's log file as the job
starts, before the app has looked at its input: a command refused for a bad value, a checkpoint it
cannot use, or one that finds a finished run with nothing left to do would rewrite the record of the run
in that folder (its ``.hydra/overrides.yaml`` would describe the refused command). So Hydra writes
neither (``hydra.output_subdir: null``, and the log file's handler is a :class:`HeldFileHandler`:
``conf/hydra/default.yaml``):

- :func:`hold_run_folder` (the folder guard, as each job starts) keeps what Hydra would have written:
  the three ``.hydra/`` files as text (rank 0 only, as Hydra would), the log records in memory;
- :func:`commit_run_folder` (each app, once its checks have passed and before its first output) writes
  them: ``.hydra/`` atomically, the held records into the log file, written as usual from then on;
- :func:`end_run_folder` (the job's end, however it ends): a command that never committed drops what
  it held when its folder held files before it (an earlier run's folder is left byte-identical); in a
  folder of its own it commits, so that the folder tells what failed there.

Outside a Hydra job (tests, notebooks) nothing is held and a commit does nothing.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from nerf_lightning.run.folder_lock import LOCK_NAME
from nerf_lightning.run.run_dir import rank_zero_only
from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["HYDRA_SUBDIR", "HeldFileHandler", "commit_run_folder", "end_run_folder", "hold_run_folder"]

#: where Hydra would have written the job's config, the Hydra config and the overrides
HYDRA_SUBDIR = ".hydra"


class HeldFileHandler(logging.FileHandler):
    """The job's log file (Hydra's ``job_logging`` file handler), opened only by :func:`commit_run_folder`:
    until then its records wait in memory, and a command that never commits drops them."""

    def __init__(
        self, filename: str, mode: str = "a", encoding: str | None = None, delay: bool = True,
        errors: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(filename, mode, encoding, delay=True, errors=errors)
        self._waiting: list[logging.LogRecord] | None = []

    def emit(self, record: logging.LogRecord) -> None:
        if self._waiting is not None:
            self._waiting.append(record)
        else:
            super().emit(record)

    def open_file(self) -> None:
        """Write the records held so far, and every later one, into the file."""
        self.acquire()
        try:
            waiting, self._waiting = self._waiting, None
            for record in waiting or []:
                super().emit(record)
        finally:
            self.release()

    def drop(self) -> None:
        """Forget the records held so far; later ones are held (and dropped) too."""
        if self._waiting is not None:
            self._waiting = []


@dataclass
class _Held:
    folder: Path
    #: whether the folder held files before this command (other than its lock file)
    existed: bool
    #: the ``.hydra/`` files as text (none on ranks other than 0)
    files: dict[str, str]
    committed: bool = False


_held: _Held | None = None


def hold_run_folder(config: DictConfig) -> None:
    """Keep what Hydra would write into the job's folder as ``config``'s job starts (the folder exists)."""
    global _held
    folder = Path(str(config.hydra.runtime.output_dir))
    files: dict[str, str] = {}
    if rank_zero_only(HYDRA_SUBDIR) is not None:
        task = copy.deepcopy(config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        files = {
            "config.yaml": OmegaConf.to_yaml(task),
            "hydra.yaml": OmegaConf.to_yaml(OmegaConf.masked_copy(config, "hydra")),
            "overrides.yaml": OmegaConf.to_yaml(config.hydra.overrides.task),
        }
    existed = any(p.name != LOCK_NAME for p in folder.iterdir()) if folder.is_dir() else False
    _held = _Held(folder, existed, files)


def commit_run_folder() -> None:
    """The app's checks have passed: write ``.hydra/`` and the held log records (once; nothing outside a
    Hydra job)."""
    held = _held
    if held is None or held.committed:
        return
    held.committed = True
    for name, text in held.files.items():
        atomic_write_bytes(held.folder / HYDRA_SUBDIR / name, text.encode())
    for handler in _held_handlers():
        handler.open_file()


def end_run_folder() -> tuple[Path, bool] | None:
    """End the job's hold: ``(folder, whether it now holds this command's record)``, None outside a job.

    An uncommitted command drops what it held when the folder held files before it, and commits in a
    folder of its own."""
    global _held
    held, _held = _held, None
    if held is None:
        return None
    if not held.committed and held.existed:
        for handler in _held_handlers():
            handler.drop()
        return held.folder, False
    _held = held
    try:
        commit_run_folder()
    except OSError:  # a folder that cannot take the record: the command's own line says why it ended
        pass
    finally:
        _held = None
    return held.folder, True


def _held_handlers() -> list[HeldFileHandler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, HeldFileHandler)]
