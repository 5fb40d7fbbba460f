"""What Lightning does around every training step that a run without use for it turns off.

The graphed training step keeps an H200 busy for about 2.2 ms at the full batch, 1.8 ms at 3/4 of it (a
rank's share when a global batch is split over more GPUs); when the host spends longer than that per step
in Lightning's loop, the GPU waits, and below the full batch it does (docs/batch_rule.md, "the loop at a
rank's batch"). Around each step Lightning calls six callback hooks on every callback, whether it
overrides them or not, each inside a ``trainer.profiler.profile(...)`` context. So the train app:

- passes :class:`QuietProfiler` when ``trainer.profiler`` is unset: the same no-op as Lightning's default
  ``PassThroughProfiler``, without building a generator-based context manager per hook call;
- removes the callbacks that declare themselves inert for the run (:func:`drop_inert_callbacks`), such as
  the Prometheus exporter without a port or the load balancer on one process;
- adds no progress bar of Lightning's own when the callbacks group has none (``callbacks.progress_bar=null``):
  Lightning's default bar refreshes every step and reads the logged metrics, a host sync.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.profilers import PassThroughProfiler

__all__ = ["QuietProfiler", "drop_inert_callbacks", "progress_bar"]

_NO_CONTEXT = nullcontext()  # reusable and reentrant


class QuietProfiler(PassThroughProfiler):
    """Lightning's default profiler (records nothing) whose ``profile(action)`` returns one shared
    ``nullcontext`` instead of a new ``@contextmanager`` generator per call."""

    def profile(self, action_name: str) -> AbstractContextManager[None]:  # type: ignore[override]
        return _NO_CONTEXT


def progress_bar(callbacks: Iterable[L.Callback], enabled: bool = True) -> tuple[list[L.Callback], bool]:
    """``(callbacks, enable_progress_bar)`` for the trainer: the bar is the callbacks group's. Without one
    (``callbacks.progress_bar=null``) the trainer gets ``enable_progress_bar=False``, so that Lightning adds
    none of its own; ``enabled=False`` (``trainer.enable_progress_bar=false``) also removes the group's."""
    kept = [cb for cb in callbacks if enabled or not isinstance(cb, ProgressBar)]
    return kept, any(isinstance(cb, ProgressBar) for cb in kept)


def drop_inert_callbacks(trainer: L.Trainer) -> list[L.Callback]:
    """Remove from ``trainer.callbacks`` those whose ``inert(trainer)`` is true: callbacks with nothing to do
    in this run (one process, no port, no logger). Returns the removed ones. Call before ``fit``: Lightning
    iterates the list it finds on every hook call."""
    keep, dropped = [], []
    for cb in trainer.callbacks:
        inert = getattr(cb, "inert", None)
        (dropped if callable(inert) and inert(trainer) else keep).append(cb)
    trainer.callbacks = keep
    return dropped
