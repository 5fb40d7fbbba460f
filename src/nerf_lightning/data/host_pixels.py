"""Training pixels in host memory (``data.storage``): for captures, or shards, that do not fit the device.

``storage=host`` keeps the training views' uint8 pixels in pinned host memory. Each step draws its
pixels on the host (from a host copy of the sampler's view probabilities, refreshed asynchronously
every step, so the draw follows them one step late), gathers their colours into a pinned staging
buffer and copies indices and colours to the device with ``non_blocking=True``. The copy runs on the
device's stream behind the previous step's kernels, which the host does not wait for: the gather of
step t+1 overlaps the device work of step t. Two staging buffers alternate; before one is refilled the
host waits for the copy out of it, issued two steps earlier. The rays themselves are computed on the
device from the device-resident cameras.

``auto`` keeps the pixels on the device when they take at most ``fraction`` of its free memory, and
otherwise on the host; the choice and the sizes are logged once. Without a GPU the device is the host:
``auto`` says ``device``, and ``host`` runs this module's path on the CPU (same batches, bit for bit).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from nerf_lightning.data.masks import KeptPixels
from nerf_lightning.data.view_set import ViewSet

__all__ = ["HostPixels", "place_views", "resolve_storage"]

log = logging.getLogger("nerf_lightning.data.datamodule")

def resolve_storage(mode: str, nbytes: int, device: torch.device, fraction: float) -> str:
    """``device`` or ``host`` for ``nbytes`` of training pixels on ``device`` (logged); ``mode`` and
    ``fraction``: ``data.storage`` and ``data.storage_fraction``, checked by the DataModule."""
    if device.type != "cuda":
        choice = "device" if mode == "auto" else mode
        log.info("data.storage=%s: %s (%.1f MB of training pixels; the device is the host)",
                 mode, choice, nbytes / 1e6)  # fmt: skip
        return choice
    free, total = torch.cuda.mem_get_info(device)
    choice = mode if mode != "auto" else ("device" if nbytes <= fraction * free else "host")
    log.info(
        "data.storage=%s: %s (%.1f MB of training pixels; %.1f of %.1f MB free on %s, limit %.0f %% of free)",
        mode, choice, nbytes / 1e6, free / 1e6, total / 1e6, device, 100 * fraction,
    )  # fmt: skip
    return choice


def place_views(views: ViewSet, mode: str, fraction: float, device: torch.device) -> HostPixels | None:
    """Move the training ``views`` to ``device``, their pixels too unless ``data.storage`` (``mode``)
    resolves to ``host``: then the pixels stay on the host, in the returned :class:`HostPixels`."""
    host = resolve_storage(mode, views.pixels.nbytes, device, fraction) == "host"
    views.to(device, pixels=not host)
    if not host:
        return None
    pixels = HostPixels(views.pixels, views.offsets, views.widths, views.heights, device)
    views.pixels = pixels.pixels  # the pinned copy only: the pageable one goes (the host holds them once)
    return pixels


def _pinned(t: Tensor) -> Tensor:
    return t.pin_memory() if torch.cuda.is_available() and not t.is_pinned() else t


class HostPixels:
    """A view set's packed pixels on the host, gathered per step and sent to ``device``.

    Args:
        pixels: uint8 [P, C], views packed row-major (``data/images.py``'s ``ImageSet.pixels``).
        offsets, widths, heights: int64 [V], the views' first rows and sizes.
        device: where the batches go.
    """

    def __init__(
        self, pixels: Tensor, offsets: Tensor, widths: Tensor, heights: Tensor, device: torch.device
    ):
        self.pixels = _pinned(pixels.cpu())
        self.offsets, self.widths, self.heights = offsets.cpu(), widths.cpu(), heights.cpu()
        self.device = device
        self._async = device.type == "cuda"
        self._staging: list[Tensor | None] = [None, None]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._probs: Tensor | None = None
        self._probs_ready: torch.cuda.Event | None = None
        self._kept: KeptPixels | None = None

    @property
    def nbytes(self) -> int:
        return self.pixels.numel() * self.pixels.element_size()

    def kept_of(self, kept: KeptPixels) -> KeptPixels:
        """The sampler's kept-pixel table (masks) on the host, copied once."""
        if self._kept is None:
            self._kept = kept.to("cpu")
        return self._kept

    def host_probs(self, view_probs: Tensor) -> Tensor:
        """The sampler's view probabilities on the host: on a GPU the copy started at the previous call
        (one step old), and a new copy starts now; on the CPU ``view_probs`` itself."""
        if not self._async:
            return view_probs
        if self._probs is None:  # first step: one synchronous copy
            self._probs = _pinned(view_probs.detach().cpu())
            return self._probs.clone()
        if self._probs_ready is not None:
            self._probs_ready.synchronize()  # a copy issued a step ago: done long since
        current = self._probs.clone()
        self._probs.copy_(view_probs.detach(), non_blocking=True)
        self._probs_ready = torch.cuda.Event()
        self._probs_ready.record()
        return current

    def gather(self, view_ids: Tensor, ix: Tensor, iy: Tensor) -> tuple[Tensor, ...]:
        """Host indices int64 [n] -> (view_ids, ix, iy, colours uint8 [n, C]) on the device."""
        flat = self.offsets[view_ids] + iy * self.widths[view_ids] + ix
        if not self._async:
            return view_ids, ix, iy, self.pixels[flat]
        turn, n, c = self._turn, flat.shape[0], self.pixels.shape[1]
        self._turn ^= 1
        event = self._copied[turn]
        if event is not None:
            event.synchronize()  # the copy out of this buffer, two steps ago
        staging = self._staging[turn]
        if staging is None or staging.shape[0] < n:
            staging = self._staging[turn] = torch.empty((n, 3 + c), dtype=torch.int64, pin_memory=True)
        rows = staging[:n]
        for i, t in enumerate((view_ids, ix, iy)):
            rows[:, i].copy_(t)
        rows[:, 3:].copy_(self.pixels[flat])
        on_device = rows.to(self.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self._copied[turn] = copied
        return on_device[:, 0], on_device[:, 1], on_device[:, 2], on_device[:, 3:].to(torch.uint8)
