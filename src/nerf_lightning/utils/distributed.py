"""Strategy factories for the ``strategy`` config group (objects Lightning's Trainer takes)."""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy


def single_device_strategy(accelerator: str = "auto") -> SingleDeviceStrategy:
    """One process on one device: the first GPU when there is one, else the CPU."""
    use_cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return SingleDeviceStrategy(device=torch.device("cuda", 0) if use_cuda else torch.device("cpu"))
