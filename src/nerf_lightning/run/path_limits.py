"""A folder name the file system can hold, checked before anything is created there.

A name longer than the file system allows (``NAME_MAX``, 255 bytes on ext4, xfs, NFS) fails every
``mkdir``, ``stat`` and ``open`` beneath it with ``ENAMETOOLONG``: Hydra would end with a traceback
when it creates the run folder. :func:`check_path_length` refuses it first, naming the key that chose
the folder and the limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from nerf_lightning.errors import UserError

__all__ = ["check_path_length", "name_limits"]

#: POSIX's minimums: what a file system that cannot be asked is assumed to allow
_NAME_MAX, _PATH_MAX = 255, 4096


def name_limits(folder: Path) -> tuple[int, int]:
    """(the longest name, the longest path) in bytes that the file system of ``folder``'s nearest
    existing parent allows."""
    existing = next((p for p in folder.parents if _is_dir(p)), Path("/"))
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return _NAME_MAX, _PATH_MAX


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # ENAMETOOLONG itself
        return False


def check_path_length(folder: Path, key: str) -> None:
    """Raise :class:`UserError` when a name in ``folder`` or the whole path is longer than its file
    system allows; ``key``: the setting that chose the folder (``hydra.run.dir``)."""
    folder = Path(os.path.abspath(folder))
    name_max, path_max = name_limits(folder)
    for part in folder.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-12:]}"
            raise UserError(
                f"{key}={folder}: the folder name '{shown}' is {size} bytes long, and the file system "
                f"allows {name_max} (NAME_MAX); choose a shorter {key}"
            )
    size = len(os.fsencode(str(folder)))
    if size > path_max:
        raise UserError(
            f"{key}={folder}: the path is {size} bytes long, and the file system allows {path_max} "
            f"(PATH_MAX); choose a shorter {key}"
        )
