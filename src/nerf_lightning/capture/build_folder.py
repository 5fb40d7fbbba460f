"""Hidden build folders (a capture, eval's views, render's frames): claimed while in use, removed once
their builder is gone.

The process app builds ``out`` in ``.<name>.tmp-<random>`` beside it
(:func:`~nerf_lightning.utils.io.atomic_directory`) and renames it into place when complete; eval builds
its ``views/`` and render its ``frames/`` the same way, inside their run folder. A builder
killed with SIGKILL (or a machine that went down) cannot remove its folder. Each build therefore holds
the folder's lock (``run/folder_lock.py``: released by the kernel when its process ends) while it
works, and the next build of the same ``out`` removes every such folder whose lock is free: the
leftovers of builders that died, never the folder of one that still runs. A build folder without a lock
file (left by a version that did not lock) counts as stale once it is :data:`UNLOCKED_GRACE_S` old.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from nerf_lightning.errors import UserError
from nerf_lightning.run.folder_lock import LOCK_NAME, claim_folder, release_folder

__all__ = ["building", "remove_stale_builds"]

log = logging.getLogger("nerf_lightning.process")

#: age after which an unlocked build folder is taken for a leftover (a fresh one is locked in a moment)
UNLOCKED_GRACE_S = 60.0


def _builds(out: Path) -> list[Path]:
    prefixes = (f".{out.name}.tmp-", f".{out.name}.old-")
    return sorted(p for p in out.parent.glob(f".{out.name}.*") if p.name.startswith(prefixes) and p.is_dir())


def _stale(folder: Path) -> bool:
    if not (folder / LOCK_NAME).exists():
        return time.time() - folder.stat().st_mtime > UNLOCKED_GRACE_S
    try:
        claim_folder(folder)
    except UserError:  # its builder is alive
        return False
    release_folder(folder)
    return True


def remove_stale_builds(out: Path) -> list[Path]:
    """Remove the build folders of ``out`` that no live process works in; returns them."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    removed = []
    for folder in _builds(out):
        if _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.warning(
                "removed %s: the build folder of an earlier run of this command that did not finish", folder
            )
    return removed


@contextlib.contextmanager
def building(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock while the body builds it; the lock file is gone before the folder is renamed."""
    claim_folder(folder)
    try:
        yield
    finally:
        release_folder(folder)
        (folder / LOCK_NAME).unlink(missing_ok=True)
