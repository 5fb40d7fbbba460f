"""Factories for the ``strategy`` and ``cluster`` config groups (objects Lightning's Trainer takes)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import lightning as L
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


def fsdp_full_precision(grad_exchange: str = "fp32") -> Any:
    """FSDP's ``MixedPrecision`` with float32 parameters, gradient reduction and buffers (``strategy=fsdp``).

    Lightning's FSDP plugin casts the parameters and buffers to bfloat16 / float16 for
    ``precision=bf16-mixed`` / ``16-mixed``. The hash table is then half precision, and the buffers that
    hold the scene box are too. A bfloat16 table cannot take the fp32/fp16 CUDA kernels, so the
    encoding fell back to the PyTorch reference: 3000 lego steps took over 140 s against 59 s in fp32
    (docs/benchmarks/2026-11-30.md). With float32 parameters, ``-mixed`` means under FSDP what it means under
    DDP: float32 weights, with autocast computing the MLPs in half precision.

    ``grad_exchange=bf16`` reduce-scatters the gradients in bfloat16 (``callbacks/grad_exchange.py``)."""
    from torch.distributed.fsdp import MixedPrecision

    from nerf_lightning.callbacks.grad_exchange import check_exchange

    reduce = torch.bfloat16 if check_exchange(grad_exchange) == "bf16" else torch.float32
    return MixedPrecision(param_dtype=torch.float32, reduce_dtype=reduce, buffer_dtype=torch.float32)


#: the module class that is an FSDP unit of its own: the hash encoding, whose table is sharded
HASH_ENCODING = "nerf_lightning.models.encoding.HashEncoding"


def fsdp_wrap_policy(unit: str = HASH_ENCODING) -> Any:
    """One FSDP unit per ``unit`` module (a class path; ``strategy=fsdp`` names the hash encoding): its
    parameters are sharded and gathered on their own."""
    import hydra
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy({hydra.utils.get_class(unit)})


def unshard_fsdp_root(trainer: L.Trainer, module: torch.nn.Module) -> None:
    """After ``fit`` under FSDP, give the module its full parameters back (no-op otherwise).

    A later ``trainer.validate`` connects the bare LightningModule again; as it already holds FSDP
    units (the hash encodings), Lightning does not wrap it a second time, so the parameters of the
    former root unit (the MLPs) would stay this rank's flat 1-D shards. They are gathered here and
    installed as plain full parameters; the hash table stays sharded in its own unit, which gathers
    it on each forward.
    """
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(trainer.strategy, FSDPStrategy) or trainer.strategy.model is None:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    root = trainer.strategy.model
    inner = {name for name, m in module.named_modules() if isinstance(m, FullyShardedDataParallel)}
    with FullyShardedDataParallel.summon_full_params(root, writeback=False):
        full = {
            name: (p.detach().clone(), p.requires_grad)
            for name, p in module.named_parameters()
            if not any(name.startswith(f"{prefix}.") for prefix in inner if prefix)
        }
    for name, (value, requires_grad) in full.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, attr, torch.nn.Parameter(value, requires_grad=requires_grad))


def fsdp_full_copy(
    trainer: L.Trainer, module: torch.nn.Module, build: Callable[[], torch.nn.Module]
) -> torch.nn.Module | None:
    """Under FSDP, a plain copy of ``module`` with its full parameters; None under other strategies.

    Collective: every rank calls it at the same point (an evaluation epoch's start). Rendering a view
    calls the field a data-dependent number of times (a chunk whose rays hit no occupied cell skips
    it) and an FSDP unit gathers its shard on every call, so ranks rendering through the sharded field
    would wait on unmatched collectives. Evaluation renders with this copy instead: one gather per
    evaluation epoch, none per view.

    Args:
        trainer: the running trainer (its strategy's wrapped model is the root of the gather).
        module: the FSDP-wrapped submodule to copy (the field).
        build: makes an unwrapped module of the same structure (its values are overwritten).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(trainer.strategy, FSDPStrategy) or trainer.strategy.model is None:
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel

    copy = build()
    targets = dict(itertools.chain(copy.named_parameters(), copy.named_buffers()))
    found: dict[str, torch.Tensor] = {}
    with FullyShardedDataParallel.summon_full_params(trainer.strategy.model, writeback=False):
        named = itertools.chain(
            module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
        )
        for name, value in named:
            clean = name.replace("_fsdp_wrapped_module.", "")
            if clean in targets and clean not in found:
                if value.shape != targets[clean].shape:
                    raise RuntimeError(
                        f"fsdp_full_copy: {clean} is {tuple(value.shape)} inside summon_full_params, "
                        f"expected {tuple(targets[clean].shape)}"
                    )
                found[clean] = value.detach().clone()
    missing = sorted(set(targets) - set(found))
    if missing:
        raise RuntimeError(f"fsdp_full_copy: no full value for {missing[:5]} (of {len(missing)})")
    with torch.no_grad():
        for name, value in found.items():
            targets[name].data = value  # the gathered clones become the copy's own tensors
    return copy.eval()


def full_parameters(trainer: L.Trainer) -> Any:
    """A context in which the module holds its whole parameters.

    FSDP keeps only this rank's shard of each parameter between forward passes; work outside one (the
    occupancy update evaluates the field) gathers them first, on every rank at once. A no-op under
    other strategies."""
    from lightning.pytorch.strategies import FSDPStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, FSDPStrategy):
        return nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(strategy.model, writeback=False)
