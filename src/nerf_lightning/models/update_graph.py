"""A whole optimizer step as one CUDA graph: the training step's forward, its backward and the optimizer's
update, captured once and replayed every step.

:func:`~nerf_lightning.models.train_step.capture` graphs the forward and the backward; the optimizer's update
then runs eagerly, and with it a path through the host that costs more than the GPU's work: Lightning's
closure around the step, the autograd engine's walk of the graphed backward, the fused Adam's grouping of
its tensors, the gradients' zeroing (about 1.1 ms a step of an H100 host's time, against a GPU step of
2.2 ms: docs/benchmarks/2026-12-07-recipe.md). :func:`capture_update` records all of it in one graph, as
PyTorch's "whole network capture" does: a replay is one launch, and the host's work per step is the
replay and the learning rate's refresh.

What the graph needs of the optimizer:

- an update that can be captured (``capturable``): ``torch.optim.Adam`` / ``AdamW``, fused or foreach; the
  optimizer's ``capturable`` flag is set here, and each group's learning rate becomes a one-element
  float32 tensor on the parameters' device, so that a scheduler's ``step()`` refreshes it in place (its
  ``fill_``) instead of a value baked into the graph;
- its state already allocated (one eager update first): state created during a capture would be
  re-initialized by every replay.

The gradients are the graph's own buffers: ``.grad`` is set to None before the capture, so the backward
writes each parameter's gradient into a buffer of the graph's pool that ``.grad`` then holds and the update
reads, and nothing zeroes them between replays (each replay overwrites them). A caller must not zero or
replace ``.grad`` after the capture.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.models.train_step import (
    FieldsStep,
    TrainStep,
    autocast_for,
    buffers_kept,
    warm_capture_stream,
)

__all__ = ["GraphedUpdate", "capture_update", "check_capturable", "graph_learning_rates", "plain_groups"]

#: forward and backward calls on the capture stream before the capture (lazy initialisation: cuBLAS handles,
#: the autograd engine's device thread, tcnn's workspace), as ``make_graphed_callables``' warm-up
WARMUP_CALLS = 3


def check_capturable(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """Raise ``ValueError`` (one line) unless ``optimizer``'s update can be captured in a CUDA graph: it has a
    ``capturable`` option, and its state is allocated for each of ``params`` (the step's trained parameters;
    the optimizer's others get no gradient from the step, and Adam leaves them alone)."""
    name = type(optimizer).__name__
    if "capturable" not in optimizer.defaults:
        raise ValueError(
            f"model.graph_optimizer: {name} has no capturable update; expected torch.optim.Adam or AdamW "
            f"(or model.graph_optimizer=false)"
        )
    missing = [p for p in params if p not in optimizer.state]
    if missing:
        raise ValueError(
            f"model.graph_optimizer: {name}'s state is not allocated for {len(missing)} parameters: run one "
            f"eager update before the capture"
        )


def graph_learning_rates(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each group's learning rate as a float32 tensor on ``device`` (a scheduler then updates it in place),
    and the update marked ``capturable``."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (isinstance(lr, Tensor) and lr.device == device and lr.dtype == torch.float32):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
        group["capturable"] = True


def plain_groups(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` with each group's learning rate a Python float again and its
    ``capturable`` flag off: a checkpoint of a graphed run is the eager run's (it resumes with either). The
    groups are new dicts; the state is shared."""
    groups = []
    for group in state["param_groups"]:
        group = dict(group)
        if isinstance(group.get("lr"), Tensor):
            group["lr"] = float(group["lr"])
        if "capturable" in group:
            group["capturable"] = False
        groups.append(group)
    return {**state, "param_groups": groups}


class GraphedUpdate:
    """``update(batch) -> (loss, per_ray_loss, ray_valid, stats)``: one replay of the captured forward,
    backward and optimizer update (:func:`capture_update`). The outputs are the graph's static tensors,
    overwritten by the next replay; a batch's fields are copied into the graph's inputs unless they are
    those very tensors' memory."""

    def __init__(
        self,
        graph: torch.cuda.CUDAGraph,
        names: tuple[str, ...],
        inputs: tuple[Tensor, ...],
        outputs: tuple[Tensor, Tensor, Tensor, Tensor],
    ) -> None:
        self.graph, self.names, self.inputs, self.outputs = graph, names, inputs, outputs

    def __call__(self, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        for name, static in zip(self.names, self.inputs, strict=True):
            tensor = getattr(batch, name)
            if tensor.data_ptr() != static.data_ptr():  # the batch graph's buffers are the inputs themselves
                static.copy_(tensor)
        self.graph.replay()
        return self.outputs


def capture_update(
    step: TrainStep,
    optimizer: torch.optim.Optimizer,
    batch: RayBatch,
    precision: str | int | None,
    *,
    share_inputs: bool = False,
) -> GraphedUpdate:
    """Capture ``step``'s forward on ``batch``, its backward and ``optimizer.step()`` as one CUDA graph.

    Args:
        step: the training step, under a sample budget (static shapes), in its eager form.
        optimizer: the torch optimizer of the step's parameters (not Lightning's wrapper), its state
            allocated (:func:`check_capturable`); its groups' learning rates become tensors
            (:func:`graph_learning_rates`).
        batch: a training batch of the step's shapes; the fields the step reads
            (:meth:`TrainStep.graph_fields`) become the graph's inputs.
        precision: the Lightning precision string (autocast during the capture; ``16-mixed``'s loss
            scaling is not captured: its caller keeps the eager update).
        share_inputs: the graph's inputs are ``batch``'s tensors themselves (the data module's batch graph
            writes the same buffers every step), not copies.

    The warm-up calls adapt the step's ray count (``n_active``); it is restored afterwards, so that the
    first replay starts where an eager step would have. No parameter or optimizer state changes.
    """
    params = [p for p in step.parameters() if p.requires_grad]
    check_capturable(optimizer, params)
    tensor_step, inputs = FieldsStep.of(step, batch, share_inputs)
    with buffers_kept(step), autocast_for(precision):
        for _ in range(WARMUP_CALLS):
            warm_capture_stream(tensor_step, inputs)
    graph_learning_rates(optimizer, inputs[0].device)
    for p in params:
        p.grad = None  # the backward's buffers in the graph's pool become .grad
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with autocast_for(precision):
            loss, per_ray, valid, stats = tensor_step(*inputs)
        loss.backward()
        optimizer.step()
    outputs = (loss.detach(), per_ray.detach(), valid, stats.detach())
    return GraphedUpdate(graph, tensor_step.names, inputs, outputs)
