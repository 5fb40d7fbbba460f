"""The gradient exchange of data parallelism (top-level ``grad_exchange``): full float32 or bfloat16.

Under DDP every rank all-reduces the whole gradient after each backward pass: the hash table's
``4 * rows * features`` bytes (48.8 MB for lego's 2^19 x 16-level table) and the MLPs' (~50 KB). With
``grad_exchange=bf16`` each gradient bucket travels as bfloat16, half the bytes, and is cast back to
float32 before the optimizer step (PyTorch's ``bf16_compress_hook`` in two passes through memory:
:func:`bf16_gradients`). The rounding error is that of one bfloat16 rounding of each rank's gradient
and of their sum, 2^-9 of its magnitude each; Adam divides by the running root mean square of the
gradient, so a relative error of that size changes an update by about as much.

- DDP: :class:`GradientExchange` registers the hook on the wrapped model when fitting starts (on every
  device: Lightning's own ``ddp_comm_hook`` argument is only registered on GPUs);
- FSDP: the same key sets ``MixedPrecision.reduce_dtype`` (``run/strategies.fsdp_full_precision``).

``fp32`` (the default) leaves DDP's own all-reduce alone.

Under ``data.shard`` each rank draws from its own shard of the training views and its gradient is
weighted by ``N * P_r`` (the sampler's mass on its shard, ``data/shards.py``) before the all-reduce
averages it: :func:`weighted_gradients` wraps the hook (or DDP's plain all-reduce) and scales each
bucket by the feedback's ``shard_weight``, a device scalar: no host sync.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import logging
from collections.abc import Callable
from typing import Any, Literal, get_args

import lightning as L
import torch
import torch.distributed as dist

from nerf_lightning.training.feedback import TrainingFeedback

log = logging.getLogger(__name__)

#: ``grad_exchange``: the gradients' dtype on the wire
Exchange = Literal["fp32", "bf16"]
#: values of :data:`Exchange`
EXCHANGES = get_args(Exchange)

Hook = Callable[[Any, dist.GradBucket], "torch.futures.Future[torch.Tensor]"]


def bf16_gradients(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``bf16_compress_hook`` with one pass through memory each way: the bucket is cast to
    bfloat16 (4 bytes read, 2 written per element), all-reduced, and the sum times ``1 / world`` written
    back into the float32 bucket (2 read, 4 written). PyTorch's divides in bfloat16 in a pass of its own
    before the all-reduce: by a power of two both divisions are exact, by another number both round the
    quotient to bfloat16 once. A function of its own also because DDP refuses the built-in hook by name
    without NCCL, although gloo all-reduces bfloat16 tensors too (the CPU tests run it there)."""
    group = process_group if process_group is not None else dist.group.WORLD
    scale = 1.0 / dist.get_world_size(group)
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16)
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def mean_into_bucket(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        torch.mul(fut.value()[0], scale, out=buffer)
        return buffer

    return future.then(mean_into_bucket)


def weighted_gradients(weight: Callable[[], torch.Tensor], inner: "Hook | None") -> "Hook":
    """``inner`` (None: a float32 all-reduce and mean) on each bucket times this rank's ``weight()``
    (read at each call: the shard's weight tensor is replaced when it moves to the device or the
    views are re-sharded)."""

    def hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        bucket.buffer().mul_(weight())
        if inner is not None:
            return inner(process_group, bucket)
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer().div_(dist.get_world_size(group))
        future = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        return future.then(lambda fut: fut.value()[0])

    return hook


def check_exchange(exchange: str) -> str:
    if exchange not in EXCHANGES:
        raise ValueError(f"grad_exchange must be one of {EXCHANGES}, got {exchange!r}")
    return exchange


def comm_hook(exchange: str) -> "Hook | None":
    """The DDP communication hook of ``exchange`` (None: DDP's float32 all-reduce)."""
    return bf16_gradients if check_exchange(exchange) == "bf16" else None


def register(model: torch.nn.parallel.DistributedDataParallel, exchange: str) -> bool:
    """Register ``exchange``'s hook on a DDP-wrapped model (before its first backward); False for fp32."""
    hook = comm_hook(exchange)
    if hook is None:
        return False
    model.register_comm_hook(None, hook)
    return True


class GradientExchange(L.Callback):
    """Registers the ``grad_exchange`` hook on the strategy's DDP model when fitting starts (module
    docstring); a no-op under one process and under FSDP (which reads the key from its config)."""

    def __init__(self, exchange: Exchange = "fp32", feedback: TrainingFeedback | None = None) -> None:
        self.exchange = check_exchange(exchange)
        self.feedback = feedback  # its shard_weight, once the DataModule shards (data.shard)

    def inert(self, trainer: L.Trainer) -> bool:
        """DDP's own float32 all-reduce, or one process: no hook to register (the train app then drops
        it: run/loop.py)."""
        return (comm_hook(self.exchange) is None and self.feedback is None) or trainer.world_size == 1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(trainer.strategy, "model", None)
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return
        feedback = self.feedback
        if feedback is not None and feedback.shard_weight is not None:
            weight = weighted_gradients(lambda: feedback.shard_weight, comm_hook(self.exchange))
            model.register_comm_hook(None, weight)
            if trainer.is_global_zero:
                log.info("data.shard: each rank's gradients weighted by its shard's sampling mass")
        elif register(model, self.exchange) and trainer.is_global_zero:
            log.info("grad_exchange=%s: gradients are all-reduced in bfloat16", self.exchange)
