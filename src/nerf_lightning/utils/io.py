"""Atomic file writes: a reader never sees a half-written file, a crash never loses the old one."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: temporary files of :func:`atomic_write_bytes` (``.<name>.<random>.tmp``); a process killed during
#: a write leaves one behind, which :func:`remove_stale_temporaries` deletes
TMP_PATTERN = ".*.tmp"

# The process umask, read once at import (reading it means setting it; not thread-safe later).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, fsync it, then rename it over ``path``.

    The file gets the mode a plain ``open(path, "wb")`` would give it (the old file's mode when it
    exists, else ``0o666 & ~umask``), not ``mkstemp``'s private 0600. A failed write raises the
    ``OSError`` with ``filename`` set to ``path`` (``error: <path>: no space left on device``).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_UMASK
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path) from err
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None:
            raise _naming(err, path) from err
        raise


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` about ``path`` (the file the caller asked for, not the temporary file or no file at all):
    a full disk (ENOSPC) surfaces in ``write`` or ``fsync``, whose errors name no file."""
    if err.errno is None:
        return err
    return type(err)(err.errno, err.strerror or os.strerror(err.errno), str(path))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that writes killed mid-way left in ``folder``; returns them.

    Use it only when no other process writes into ``folder``."""
    removed = []
    for tmp in Path(folder).glob(TMP_PATTERN):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


@contextmanager
def atomic_directory(out: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Build a folder in a temporary sibling of ``out`` and move it into place only when the body succeeds.

    Yields the temporary folder (``.<name>.tmp-<random>`` next to ``out``, so the final rename stays on
    one file system). When the body raises, the temporary folder is removed and ``out`` is untouched.
    When it returns, the folder is renamed to ``out``: an absent or empty ``out`` is replaced; one that
    holds files is replaced only with ``overwrite`` (it is first moved aside, then deleted), otherwise
    ``FileExistsError``. A process killed half-way leaves only the hidden temporary folder behind.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~_UMASK)  # the mode of a plain mkdir, not mkdtemp's private 0700
        yield tmp
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if out.exists() or out.is_symlink():
            if not overwrite:
                raise FileExistsError(f"{out} exists and is not empty")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
