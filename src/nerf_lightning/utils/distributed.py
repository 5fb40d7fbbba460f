"""Factories for the ``strategy`` and ``cluster`` config groups (objects Lightning's Trainer takes)."""

from __future__ import annotations

import signal

import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import SingleDeviceStrategy


def single_device_strategy(accelerator: str = "auto") -> SingleDeviceStrategy:
    """One process on one device: the first GPU when there is one, else the CPU."""
    use_cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return SingleDeviceStrategy(device=torch.device("cuda", 0) if use_cuda else torch.device("cpu"))


def slurm_environment(auto_requeue: bool = True, requeue_signal: str = "SIGUSR1") -> SLURMEnvironment:
    """Lightning's SLURM environment with the requeue signal given by name (``SIGUSR1``, ``USR1``)."""
    name = str(requeue_signal).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        sig = signal.Signals[name]
    except KeyError:
        raise ValueError(
            f"cluster.requeue_signal: {requeue_signal!r} is not a signal name (e.g. SIGUSR1, SIGUSR2); "
            "use the signal of sbatch --signal"
        ) from None
    return SLURMEnvironment(auto_requeue=auto_requeue, requeue_signal=sig)
