"""The DataModule's loaders: step numbers for training, view indices for evaluation.

The loaders only yield small indices; the DataModule turns them into rays on the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

__all__ = ["StepIndices", "StepLoader", "ViewIndices", "rank_views"]


class StepIndices(IterableDataset):
    """Yields ``steps_per_epoch`` step numbers: a training "batch" is just a request for rays.

    Plain ints, not tensors: Lightning copies tensor batches to the device, and a host->device copy
    from pageable memory waits for the GPU's queue to drain, a host sync every step.
    """

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def __iter__(self) -> Iterator[int]:
        yield from range(self.steps_per_epoch)

    def __len__(self) -> int:
        return self.steps_per_epoch


class StepLoader(DataLoader):
    """The training loader: resumable mid-epoch, because it has no state to resume.

    Its items are step numbers that nothing reads (``train_batch`` draws the rays from the sampler,
    whose state is in the DataModule's ``state_dict``); Lightning's loop tracks the position within
    the epoch and ends a resumed epoch after the remaining steps. Implementing the ``_Stateful``
    protocol tells Lightning that resuming mid-epoch is exact (no "dataloader is not resumable"
    warning)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class ViewIndices(Dataset):
    """The held-out views one process renders."""

    def __init__(self, views: list[int]) -> None:
        self.views = views

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, i: int) -> int:
        return self.views[i]


def rank_views(n: int, rank: int, world: int) -> list[int]:
    """The held-out views (of ``n``) that process ``rank`` of ``world`` renders: ``rank, rank + world, ...``.

    Every rank renders the same number of views, ceil(n / world): the ranks with fewer views render
    their last one (or view ``rank % n``) again, and ViewMetrics counts a view once. Under FSDP each
    validation step is a collective (the root unit gathers its shard), so unequal counts would hang;
    under DDP the padding costs no wall time (the busiest rank sets it). (Lightning's
    DistributedSampler would count the repeated views twice; ``trainer.use_distributed_sampler`` is
    off.)
    """
    views = list(range(rank, n, world))
    per_rank = -(-n // world)
    while n > 0 and len(views) < per_rank:
        views.append(views[-1] if views else rank % n)
    return views
