"""One run at a time in a run folder: an exclusive lock on ``<folder>/.lock``, held for the run's life.

Checking a folder for an earlier run and then writing into it is a race: two commands started at the
same moment both find it empty, and the folder ends up with the files of both. The run therefore
*claims* its folder first, atomically, and checks it afterwards (``run/folder_guard.py``).

The claim is a POSIX record lock (``fcntl.lockf``) on ``<folder>/.lock``:

- the kernel releases it when the process ends, however it ends (``kill -9``, out of memory, a node
  that reboots: the NFS server drops the locks of a client whose lease ran out), so a folder left by a
  run that died is never mistaken for a folder in use; the file records the holder's pid, host and
  start time, which the next run reports as "left by a run that did not finish" (a run that ends
  normally clears it; a command refused before it wrote anything puts back what it found,
  :func:`abandon_folder`);
- it belongs to the process, not to its children: a forked worker does not keep it after the run's
  process is gone, and a restarted worker group (torchrun ``--max-restarts``, a requeued SLURM job, a
  restarted pod) finds it free;
- it works on local disks and on NFS (v4, or v3 with ``lockd``); a file system without locks gets a
  warning and no claim.

Only the job's rank-0 process (or the process that launches the ranks) claims: the other ranks of the
job write into the same folder by design.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from nerf_lightning.errors import UserError

__all__ = ["LOCK_NAME", "FolderLock", "abandon_folder", "claim_folder", "held_locks", "release_folder"]

log = logging.getLogger("nerf_lightning.run")

#: the lock file in the run folder (hidden: not an output)
LOCK_NAME = ".lock"

_BUSY = (errno.EACCES, errno.EAGAIN)
_held: dict[Path, FolderLock] = {}


@dataclass
class FolderLock:
    """A claimed folder: the open lock file (closing it would release the lock) and what it said before."""

    folder: Path
    fd: int
    #: the record a run left without clearing it (it did not finish), else None
    previous: dict | None
    #: the lock file's bytes before this claim (put back by :func:`abandon_folder`)
    previous_raw: bytes = b""
    #: whether this claim created the lock file
    created: bool = False


def held_locks() -> list[Path]:
    """The folders this process holds."""
    return list(_held)


def _raw(fd: int) -> bytes:
    # pread on the lock's own descriptor: opening and closing the file again would drop a POSIX lock
    return os.pread(fd, 1 << 16, 0)


def _record(raw: bytes) -> dict | None:
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {"pid": "?", "host": "?", "started": "?"}
    return data if isinstance(data, dict) else None


def describe(record: dict | None) -> str:
    """``pid 123 on host, started 2026-12-05 10:00:00`` (what the lock file says of its holder)."""
    if not record:
        return "a process that left no record"
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started {record.get('started', '?')}"


def claim_folder(folder: Path) -> FolderLock | None:
    """Claim ``folder`` (created if needed) for this process; a second claim by this process is a no-op.

    Returns the lock (None on a file system without locks: a warning is logged).

    Raises:
        UserError: another live process holds the folder.
    """
    folder = Path(folder).resolve()
    if folder in _held:
        return _held[folder]
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        fd, created = _open_lock_file(folder / LOCK_NAME)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _record(_raw(fd))
            os.close(fd)
            _refuse(folder, err, holder)
            return None  # a file system without locks
        if _still_there(folder / LOCK_NAME, fd):
            break
        os.close(fd)  # a refused command removed the file it had created: lock the one there now
    raw = _raw(fd)
    previous = _record(raw)
    if previous is not None:
        gone = describe(previous)
        log.warning("%s was left by a run that did not finish (%s); that process is gone", folder, gone)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
    lock = FolderLock(folder, fd, previous, raw, created)
    _held[folder] = lock
    return lock


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """A descriptor of the lock file, and whether this call created it."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
    except FileExistsError:
        pass
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC), False
    except FileNotFoundError:  # removed in between
        return _open_lock_file(path)


def _still_there(path: Path, fd: int) -> bool:
    """Whether ``fd`` is the file at ``path`` (not one removed after it was opened)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _refuse(folder: Path, err: OSError, holder: dict | None) -> None:
    """The claim failed with ``err``: :class:`UserError` when another process holds the folder, a warning
    on a file system without locks, else ``err`` itself."""
    if err.errno in _BUSY:
        raise UserError(
            f"{folder}: another run is writing into this folder ({describe(holder)}); wait for it to "
            "end, or choose another hydra.run.dir"
        ) from None
    if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        log.warning("%s: the file system has no locks; two runs into this folder would not be told apart",
                    folder)  # fmt: skip
        return
    raise err


def release_folder(folder: Path) -> None:
    """Clear the record (the run ended) and release ``folder``'s lock, if this process holds it."""
    lock = _held.pop(Path(folder).resolve(), None)
    if lock is None:
        return
    try:
        os.ftruncate(lock.fd, 0)
    finally:
        os.close(lock.fd)  # releases the lock


def abandon_folder(folder: Path) -> None:
    """Release ``folder``'s lock, if this process holds it, leaving the lock file as the claim found it:
    its earlier bytes put back (the record of a run that died stays), or the file removed when the claim
    created it. For a command refused before it wrote anything."""
    lock = _held.pop(Path(folder).resolve(), None)
    if lock is None:
        return
    try:
        if lock.created:  # removed while still locked: a claim that opened it meanwhile sees it is gone
            (lock.folder / LOCK_NAME).unlink(missing_ok=True)
        else:
            os.ftruncate(lock.fd, 0)
            os.pwrite(lock.fd, lock.previous_raw, 0)
    finally:
        os.close(lock.fd)
