"""Training batches drawn by replaying CUDA graphs: one launch per batch instead of dozens of kernels."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from nerf_lightning.data.ray_batch import RayBatch

__all__ = ["BatchGraphs"]

log = logging.getLogger("nerf_lightning.data.datamodule")


class BatchGraphs:
    """``draw(n_rays)`` replayed from a CUDA graph captured on first use, one graph per ray count.

    The returned :class:`RayBatch` holds the graph's static outputs: the next replay overwrites the same
    tensors in place, so a step must consume its batch before asking for the next one (the training loop
    does).

    Args:
        draw: draws one training batch of ``n_rays`` rays on the current CUDA device (no host sync).
        strict: raise when a capture fails (``model.cuda_graph=true``); else warn and draw eagerly.
    """

    def __init__(self, draw: Callable[[int], RayBatch], strict: bool) -> None:
        self.draw, self.strict = draw, strict
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, RayBatch] | None] = {}

    def batch(self, n_rays: int) -> RayBatch:
        if n_rays not in self._graphs:
            self._graphs[n_rays] = self._capture(n_rays)
        entry = self._graphs[n_rays]
        if entry is None:
            return self.draw(n_rays)
        graph, batch = entry
        graph.replay()
        return batch

    def captured(self) -> dict[int, bool]:
        """Ray count -> whether its batches replay a graph (False: its capture failed)."""
        return {n: entry is not None for n, entry in self._graphs.items()}

    def _capture(self, n_rays: int) -> tuple[torch.cuda.CUDAGraph, RayBatch] | None:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture (allocator, lazy init)
                for _ in range(2):
                    self.draw(n_rays)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                batch = self.draw(n_rays)
            return graph, batch
        except Exception as err:  # noqa: BLE001 - an uncapturable sampler still trains, eagerly
            if self.strict:
                raise
            log.warning("model.cuda_graph=auto: drawing batches eagerly (capture failed: %s)", err)
            return None
