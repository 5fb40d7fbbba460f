"""Whether an allocation fits on a device, asked before allocating it.

An image or a grid sized by a key (``render width=``, ``export resolution=``) can ask for more memory
than any machine has: PyTorch then fails deep inside with a traceback, or the kernel's OOM killer ends
the process without a word. An app computes the bytes it will hold and calls :func:`check_fits` first:
a :class:`~nerf_lightning.errors.UserError` naming the key, the bytes needed and the bytes the device
has available.

Available memory: on the CPU, ``psutil.virtual_memory().available`` when psutil is installed, else
``MemAvailable`` of ``/proc/meminfo``; on a CUDA device, the free bytes of ``torch.cuda.mem_get_info``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nerf_lightning.errors import UserError

__all__ = ["available_bytes", "check_fits", "show_bytes"]

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def show_bytes(n: float) -> str:
    """``n`` bytes to 3 significant digits in decimal units: ``40 GB``, ``2.5 PB``."""
    i = 0
    while abs(n) >= 1000 and i < len(_UNITS) - 1:
        n /= 1000
        i += 1
    return f"{n:.3g} {_UNITS[i]}"


def available_bytes(device: torch.device) -> int | None:
    """The bytes that can be allocated on ``device`` now (None: unknown, e.g. no ``/proc`` here)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        import psutil
    except ImportError:
        return _meminfo_available()
    return int(psutil.virtual_memory().available)


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # the file counts kB
    return None


def check_fits(what: str, device: torch.device, device_bytes: int, host_bytes: int, advice: str) -> None:
    """Raise :class:`UserError` when an allocation does not fit: ``device_bytes`` on ``device`` and
    ``host_bytes`` in the CPU's memory (on a CPU device, their sum).

    ``what``: the command and keys that size the allocation (``render width=100000 height=100000``) and
    what it holds; ``advice``: what to change. An unknown availability lets the allocation through."""
    cpu = torch.device("cpu")
    if device.type == "cpu":
        needs = [(cpu, device_bytes + host_bytes)]
    else:
        needs = [(device, device_bytes), (cpu, host_bytes)]
    for where, needed in needs:
        available = available_bytes(where)
        if available is None or needed <= available:
            continue
        name = "the CPU" if where.type == "cpu" else f"GPU {where.index or 0}"
        raise UserError(
            f"{what} needs {show_bytes(needed)} of memory, and {name} has {show_bytes(available)} "
            f"available; {advice}"
        )
