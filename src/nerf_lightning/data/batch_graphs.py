"""Training batches drawn by replaying CUDA graphs: one launch per batch instead of dozens of kernels."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BatchGraphs"]

log = logging.getLogger("nerf_lightning.data.datamodule")


class BatchGraphs:
    """``draw(n_rays, factor)`` replayed from a CUDA graph captured on first use, one graph per ray count
    and downscale factor (a resolution stage draws its batches through its own graph, captured when the
    stage starts; the shapes are the same in every stage).

    The returned tensors are the graph's static outputs: the next replay overwrites them, so a step
    must consume its batch before asking for the next one (the training loop does).

    Args:
        draw: draws one training batch on the current CUDA device (no host sync).
        prepare: called with the factor before a capture, outside it (the block images of a stage are
            made on the current stream).
        strict: raise when a capture fails (``data.cuda_graph=true``); else warn and draw eagerly.
    """

    def __init__(
        self, draw: Callable[[int, int], dict[str, Any]], prepare: Callable[[int], None], strict: bool
    ) -> None:
        self.draw, self.prepare, self.strict = draw, prepare, strict
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, Any]] | None] = {}

    def batch(self, n_rays: int, factor: int = 1) -> dict[str, Any]:
        key = (n_rays, factor)
        if key not in self._graphs:
            self._graphs[key] = self._capture(n_rays, factor)
        entry = self._graphs[key]
        if entry is None:
            return self.draw(n_rays, factor)
        graph, batch = entry
        graph.replay()
        return batch

    def captured(self) -> dict[tuple[int, int], bool]:
        """(ray count, factor) -> whether its batches replay a graph (False: its capture failed)."""
        return {key: entry is not None for key, entry in self._graphs.items()}

    def keep_factor(self, factor: int) -> None:
        """Free the graphs of every other downscale factor (a new resolution stage)."""
        old = [key for key in self._graphs if key[1] != factor]
        if any(self._graphs[key] is not None for key in old):
            # A graph must not be destroyed while a replay of it may still run; the next stage's
            # capture synchronizes anyway, so this one wait per stage change costs nothing.
            torch.cuda.synchronize()
        for key in old:
            del self._graphs[key]

    def _capture(self, n_rays: int, factor: int) -> tuple[torch.cuda.CUDAGraph, dict[str, Any]] | None:
        try:
            if factor > 1:
                self.prepare(factor)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture (allocator, lazy init)
                for _ in range(2):
                    self.draw(n_rays, factor)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                batch = self.draw(n_rays, factor)
            return graph, batch
        except Exception as err:  # noqa: BLE001 - an uncapturable sampler still trains, eagerly
            if self.strict:
                raise
            log.warning("data.cuda_graph=auto: drawing batches eagerly (capture failed: %s)", err)
            return None
