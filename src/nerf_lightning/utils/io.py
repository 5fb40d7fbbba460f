"""Atomic file writes: a reader never sees a half-written file, a crash never loses the old one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

#: temporary files of :func:`atomic_write_bytes` (``.<name>.<random>.tmp``); a process killed during
#: a write leaves one behind, which :func:`remove_stale_temporaries` deletes
TMP_PATTERN = ".*.tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same folder, fsync, rename.

    The file gets the permissions of a plain ``open(path, "wb")`` (0666 minus the umask), not the
    owner-only mode of ``mkstemp``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that writes killed mid-way left in ``folder``; returns them.

    Only call it when no other process writes into ``folder``."""
    removed = []
    for tmp in Path(folder).glob(TMP_PATTERN):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed
