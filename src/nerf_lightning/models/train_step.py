"""The training forward: rays -> loss, one path for every configuration.

:class:`TrainStep` applies the per-view corrections, renders, and computes the loss, the optional
distortion and opacity terms and the step's statistics. With a sample budget (``model.net.step``'s
default, instant-ngp's and nerfacc's 2^18 samples per step) the shapes are static: the batch holds
``R`` ray slots, the first ``n_active`` are marched, and the renderer keeps rays in order while their
samples fit. After each call ``n_active`` is re-estimated *on the device* from the measured samples
per ray, so nothing is read back by the host, and the whole forward and its backward can be captured
once as CUDA graphs and replayed (:func:`capture`): one launch instead of ~150. Without a budget
(the CPU preset) every ray of the batch is rendered, with shapes that follow the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any, NamedTuple

import torch
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Formerly, Injected, KeysOf, Note, Range
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.models.loss import StepLoss
from nerf_lightning.volume.renderer import Renderer, SampleBudget, opacity_error, ray_distortion

__all__ = [
    "THROUGHPUT_HEADROOM",
    "FieldsStep",
    "StepStats",
    "TrainStep",
    "autocast_for",
    "buffers_kept",
    "capture",
    "holds_tcnn",
    "train_step",
    "warm_capture_stream",
]

#: Under batch_rule=throughput a rank may take up to this many times its even share of the budget.
THROUGHPUT_HEADROOM = 1.5


class StepStats(NamedTuple):
    """The statistics of one training step, float64 scalar tensors on the device (read without a host
    sync), named views of the ``stats`` [4] that :class:`TrainStep` returns (:meth:`of`)."""

    rays: Tensor  # valid rays
    marched_samples: Tensor  # samples of the valid rays in the marching pass
    rendered_samples: Tensor  # samples in the differentiable pass
    squared_error: Tensor  # sum over the valid rays of the squared error, averaged over channels

    @classmethod
    def of(cls, stats: Tensor) -> StepStats:
        """The named entries of ``stats`` [4] (views: no copy, no kernel)."""
        return cls(*stats.unbind())

    @property
    def mse(self) -> Tensor:
        """Mean squared error over the valid rays."""
        return self.squared_error / self.rays.clamp_min(1.0)


class TrainStep(nn.Module):
    """``forward(batch: RayBatch) -> (loss, per_ray_loss, ray_valid, stats)``: it reads the batch's
    fields that :meth:`graph_fields` names (``data/ray_batch.py``).

    Args:
        field: the radiance field (``models/field.py``), shared with the LightningModule.
        renderer: the renderer (owns the occupancy grid and the ops backend), shared with the
            LightningModule.
        loss: the loss's kind and weights (``models/loss.py``: ``model.net.loss``, ``alpha_weight``
            resolved); None: its defaults. Per ray the mean over the channels; the distortion term
            (``ops.distortion_loss`` of the renderer's ops, mean over the valid rays) and the opacity
            term (mean over the valid rays of ``(opacity - alpha)^2`` against the batch's ``alpha``)
            are added with their weights, and left out of the step at weight 0.
        sample_budget: sample slots of the differentiable pass (instant-ngp: 2^18); None: no budget,
            every ray of the batch is rendered.
        march_budget: sample slots of the marching / no-grad density pass (>= sample_budget).
        n_rays_init: rays marched in the first budgeted step (then adapted; at most the batch's slots).
        min_rays: lower bound of the adapted ray count.
        adapt_momentum: weight of the previous estimate when ``n_active`` is re-estimated.
        jitter: randomize each ray's first sample (training; off only for exact comparisons).
        camera_opt: learned pose corrections (``models/camera_opt.py``) applied to each ray by the
            batch's ``view_ids`` before marching, or None.
        appearance: learned per-view exposure (``models/appearance.py``) applied to each ray's colour
            before the loss, or None. Both are shared with the LightningModule; their parameters are
            read in place by a captured graph, like the field's.

    Returns of ``forward``:
        loss: mean per-ray loss over the valid rays (scalar, differentiable);
        per_ray_loss: float [R], 0 for rays left out of the step (detached);
        ray_valid: bool [R] (all True without a budget);
        stats: float64 [4] = (valid rays, marched samples, rendered samples, sum of squared error
            over valid rays, averaged over channels), detached; :meth:`StepStats.of` names them. One
            tensor, so that a captured CUDA graph hands it over in one static buffer.

    The loss and the bookkeeping after it (statistics, next ray count) are one op each
    (``ops.masked_ray_loss``, ``ops.adapt_ray_count``): a kernel each on the GPU instead of about
    fifty elementwise kernels on scalars, whose launch boundaries cost more than their work.
    """

    def __init__(
        self,
        field: nn.Module,
        renderer: Renderer,
        loss: Annotated[StepLoss | None, Injected("build_nerf: model.net.loss, resolved")] = None,
        *,
        sample_budget: Annotated[
            int | None,
            Range(low=1),
            Note("null: data.batch_size rays per step"),
            Formerly("model.sample_budget"),
        ],
        march_budget: Annotated[
            int | None,
            Range(low=1),
            Note(">= sample_budget; null: 4 x sample_budget"),
            Formerly("model.march_budget"),
        ] = None,
        n_rays_init: Annotated[int, Range(low=1), Formerly("model.n_rays_init")] = 4096,
        min_rays: Annotated[int, Range(low=1)] = 64,
        adapt_momentum: Annotated[float, Range(low=0, below=1)] = 0.5,
        jitter: Annotated[bool, Formerly("model.jitter")] = True,
        camera_opt: Annotated[nn.Module | None, Injected("build_nerf: model.net.camera_opt")] = None,
        appearance: Annotated[nn.Module | None, Injected("build_nerf: model.net.appearance")] = None,
    ) -> None:
        super().__init__()
        check_arguments(TrainStep, locals())
        if sample_budget is not None:
            march_budget = 4 * sample_budget if march_budget is None else march_budget
            if march_budget < sample_budget:  # the one rule between two keys
                raise ValueError(
                    f"model.net.step.march_budget={march_budget}: expected >= model.net.step.sample_budget "
                    f"({sample_budget})"
                )
        self.field = field
        self.renderer = renderer
        loss = loss if loss is not None else StepLoss()
        if loss.alpha_weight == "auto":
            raise ValueError("TrainStep: resolve the loss's alpha_weight=auto first (StepLoss.resolved)")
        self.loss, self.huber_delta = loss.kind, loss.huber_delta
        #: whether the step runs under a fixed sample budget (static shapes)
        self.budgeted = sample_budget is not None
        self.base_sample_budget = self.sample_budget = int(sample_budget or 0)
        self.base_march_budget = self.march_budget = int(march_budget or 0)
        self.min_rays = int(min_rays)
        self.base_adapt_momentum = self.adapt_momentum = float(adapt_momentum)
        self.n_rays_init = int(n_rays_init)
        self.jitter = bool(jitter)
        self.distortion_weight = loss.distortion_weight
        self.alpha_weight = float(loss.alpha_weight)
        self.camera_opt = camera_opt
        self.appearance = appearance
        if self.budgeted:
            self.register_buffer("n_active", torch.tensor(int(n_rays_init), dtype=torch.int64))
            self.register_buffer("n_active_f", torch.tensor(float(n_rays_init), dtype=torch.float32))
            # share of the capacities the ray count aims at (< 1 leaves headroom for load balancing)
            self.register_buffer("target_fraction", torch.tensor(1.0))

    def set_capacity_scale(self, scale: float, target_fraction: float = 1.0) -> None:
        """Capacities = ``scale`` x the constructor's budgets; aim at ``target_fraction`` of them; the first
        step marches ``n_rays_init`` x the work aimed at. Nothing to scale without a budget.

        Call before the first step (capacities are baked into a captured graph); the fraction is a
        buffer and may change at any time."""
        if not self.budgeted:
            return
        self.sample_budget = max(1, int(self.base_sample_budget * scale))
        self.march_budget = max(self.sample_budget, int(self.base_march_budget * scale))
        self.target_fraction.fill_(float(target_fraction))
        work = float(scale) * float(target_fraction)
        if abs(work - 1.0) > 1e-9:
            n_init = max(1, int(round(self.n_rays_init * work)))
            self.n_active.fill_(n_init)
            self.n_active_f.fill_(float(n_init))

    def set_clock_rate(self, rate: float) -> None:
        """Each step counts ``rate`` reference steps (``training/clock.py``): the ray-count estimate keeps
        ``adapt_momentum ** rate`` of the previous one, so it follows the field over as many rays as it
        does on one GPU. Call before the first step (the momentum is baked into a captured graph)."""
        self.adapt_momentum = self.base_adapt_momentum ** float(rate)

    def follow_clock(self, clock: Any) -> None:
        """This rank's budget under the run's batch rule (a ``TrainingClock``): ``rank_multiple`` x the
        configured budget, with headroom when the ranks split the work by their speed. Call before the
        first step."""
        if clock.splits_by_throughput:
            self.set_capacity_scale(clock.rank_multiple * THROUGHPUT_HEADROOM, 1.0 / THROUGHPUT_HEADROOM)
        else:
            self.set_capacity_scale(clock.rank_multiple)
        self.set_clock_rate(clock.rate)

    def set_work_share(self, scale: float) -> bool:
        """Aim at ``scale`` x the even share of the budget (``batch_rule=throughput``, at most the headroom);
        False without a budget (the rays per step carry the share then)."""
        if not self.budgeted:
            return False
        self.target_fraction.fill_(min(scale, THROUGHPUT_HEADROOM) / THROUGHPUT_HEADROOM)
        return True

    def state_buffers(self) -> dict[str, Tensor]:
        """The adapted ray count, state of the run (empty without a budget)."""
        return {name: getattr(self, name) for name in ("n_active", "n_active_f") if self.budgeted}

    def graph_fields(self) -> tuple[str, ...]:
        """The :class:`RayBatch` fields :meth:`forward` reads, in order: the static inputs of its CUDA
        graph (:func:`capture`). ``view_ids`` for the per-view corrections, ``alpha`` for the opacity
        loss."""
        names = ("rays_o", "rays_d", "rgb", "background")
        if self.camera_opt is not None or self.appearance is not None:
            names = (*names, "view_ids")
        return (*names, "alpha") if self.alpha_weight > 0 else names

    def forward(self, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if batch.alpha is None and self.alpha_weight > 0:
            raise ValueError(
                "TrainStep: alpha_weight > 0 needs the rays' target alpha (the batch's alpha: images that "
                "carry alpha, drawn by a DataModule that shares the model's TrainingFeedback, alpha_targets)"
            )
        rays_o, rays_d, target, background = batch.rays_o, batch.rays_d, batch.rgb, batch.background
        view_ids, alpha = batch.view_ids, batch.alpha
        ops = self.renderer.ops
        if self.camera_opt is not None:
            rays_o, rays_d = self.camera_opt(view_ids, rays_o, rays_d)
        budget = None
        if self.budgeted:
            budget = SampleBudget(self.march_budget, self.sample_budget, self.n_active)
        out = self.renderer.render_rays(
            self.field, rays_o, rays_d, background, jitter=self.jitter, budget=budget
        )
        valid, rgb = out.ray_valid, out.rgb
        if self.appearance is not None:
            rgb = self.appearance(view_ids, rgb, out.opacity, background)
        loss, per_ray, aux = ops.masked_ray_loss(rgb, target, valid, self.loss, self.huber_delta)
        n_valid = aux[0].clamp_min(1.0).float()
        if self.distortion_weight > 0:
            # the rays left out have no samples in the fixed layout: 0
            loss = loss + self.distortion_weight * ray_distortion(out, ops).sum() / n_valid
        if self.alpha_weight > 0:
            # dropped rays render opacity 0; their slots are left out as in the photometric loss
            alpha_error = torch.where(valid, opacity_error(out, alpha), 0.0)
            loss = loss + self.alpha_weight * alpha_error.sum() / n_valid
        if not self.budgeted:  # the renderer counted the samples
            counts = torch.stack([out.n_samples, out.n_samples_rendered]).to(torch.float64)  # type: ignore[list-item]
            return loss, per_ray, valid, torch.stack([aux[0], counts[0], counts[1], aux[1]])
        # The marching kernel clamps n_active to the ray slots itself; the update keeps it there.
        stats = ops.adapt_ray_count(
            aux,
            valid,
            out.marched_counts,
            out.packed_info[:, 1],
            self.n_active,
            self.n_active_f,
            self.target_fraction,
            sample_budget=self.sample_budget,
            march_budget=self.march_budget,
            min_rays=self.min_rays,
            n_slots=rays_o.shape[0],
            momentum=self.adapt_momentum,
        )
        return loss, per_ray, valid, stats


def train_step(
    field: Annotated[nn.Module, Injected("build_nerf: its field")],
    renderer: Annotated[Renderer, Injected("build_nerf: its renderer")],
    loss: Annotated[StepLoss | None, Injected("build_nerf: model.net.loss, resolved")] = None,
    **kwargs: Annotated[Any, KeysOf(TrainStep)],
) -> TrainStep:
    """The ``model.net.step`` config node: a :class:`TrainStep` (``sample_budget: null``: no budget, the
    CPU preset). ``build_nerf`` passes the field, the renderer, the loss and the per-view components."""
    return TrainStep(field, renderer, loss, **kwargs)


def autocast_for(precision: str | int | None) -> Any:
    """The autocast context of a Lightning precision string, with the autocast cache off.

    CUDA graphs must not rely on autocast's weight-cast cache (a cached cast would be captured once
    and never refreshed after an optimizer step), so capture and replay run with ``cache_enabled=False``.
    """
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(str(precision))
    if dtype is None:
        return nullcontext()
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


def capture(
    step: TrainStep,
    batch: RayBatch,
    precision: str | int | None,
    *,
    alias_gradients: bool = True,
    share_inputs: bool = False,
) -> TrainStep:
    """Capture ``step``'s forward and backward as CUDA graphs (``torch.cuda.make_graphed_callables``).

    ``step`` itself is returned, its forward replaced by the graphs' replay: outputs and the parameters'
    gradients come from static buffers. Parameters, the occupancy bitfield and the ``n_active`` buffer are
    read in place, so optimizer steps and occupancy updates made between replays are seen. The graphs'
    static inputs are the fields of ``batch`` that the step reads (:meth:`TrainStep.graph_fields`); a
    replay copies a batch's field into them unless it is that very tensor.

    Args:
        step: the training step, under a sample budget (static shapes).
        batch: a training batch of the step's shapes (int64 ``view_ids`` [R]: the rays' training views,
            read by the per-view corrections; float ``alpha`` [R]: their target opacity, read by the
            opacity loss).
        precision: the Lightning precision string (autocast for capture and replay).
        alias_gradients: ``.grad`` of each parameter becomes the backward graph's output buffer
            itself (autograd takes over the tensor when ``.grad`` is None: zero the gradients with
            ``set_to_none=True``), so no per-parameter add or fill runs. Only valid when every
            optimizer step follows exactly one backward: with gradient accumulation (False),
            gradients are pre-allocated and autograd adds the buffers into them (zero them with
            ``set_to_none=False``).
        share_inputs: the graph's static inputs are ``batch``'s tensors themselves, not copies: a call
            with these very tensors (the data module's batch graph writes the same buffers every
            step) copies nothing, but a call with other tensors copies them *into the caller's
            first tensors*. Only for callers that own those buffers (the LightningModule); False
            clones them.
    """
    for p in step.parameters():
        if not p.requires_grad:
            continue
        if alias_gradients:
            p.grad = None  # autograd then takes over the graph's buffer
        elif p.grad is None:
            p.grad = torch.zeros_like(p)
    tensor_step, args = FieldsStep.of(step, batch, share_inputs)
    # The warm-up calls of make_graphed_callables adapt n_active: start the replays where eager
    # execution would have started.
    with buffers_kept(step), autocast_for(precision):
        if holds_tcnn(step):
            warm_capture_stream(tensor_step, args)
        graphed = torch.cuda.make_graphed_callables(
            tensor_step, args, num_warmup_iters=3, allow_unused_input=True
        )
    names = tensor_step.names
    step.forward = _GraphedForward(graphed, names)  # type: ignore[method-assign]
    return step


class FieldsStep(nn.Module):
    """``step`` called with the tensors of ``names`` (the rest of the batch: ``template``'s), the
    tensor-only callable that a CUDA graph captures."""

    def __init__(self, step: TrainStep, names: tuple[str, ...], template: RayBatch) -> None:
        super().__init__()
        self.step, self.names, self.template = step, names, template

    @classmethod
    def of(
        cls, step: TrainStep, batch: RayBatch, share_inputs: bool
    ) -> tuple[FieldsStep, tuple[Tensor, ...]]:
        """``step`` as a callable of ``batch``'s fields that it reads (:meth:`TrainStep.graph_fields`), and
        those fields: a graph's static inputs, ``batch``'s tensors themselves with ``share_inputs``, else
        copies. The fields the step does not read stay ``batch``'s (never read by a graph)."""
        names = step.graph_fields()
        fields = [getattr(batch, name) for name in names]
        if any(t is None for t in fields):
            TrainStep.forward(step, batch)  # raises its one line on the field the batch lacks
        inputs = tuple(t.detach() if share_inputs else t.detach().clone() for t in fields)
        return cls(step, names, batch.replace(**dict(zip(names, inputs, strict=True)))), inputs

    def forward(self, *tensors: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        batch = self.template.replace(**dict(zip(self.names, tensors, strict=True)))
        return TrainStep.forward(self.step, batch)  # the eager forward, whatever ``step.forward`` is now


@contextmanager
def buffers_kept(step: TrainStep) -> Iterator[None]:
    """``step``'s own buffers (the adapted ray count) as they were on entry, again on exit: a capture's
    warm-up calls adapt them, and the replays start where eager execution would have."""
    saved = {name: b.clone() for name, b in step.named_buffers(recurse=False)}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                getattr(step, name).copy_(value)


class _GraphedForward:
    """The captured step's forward: a batch's fields ``names`` into the graphs' replay."""

    def __init__(self, graphed: nn.Module, names: tuple[str, ...]) -> None:
        self.graphed, self.names = graphed, names

    def __call__(self, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.graphed(*(getattr(batch, name) for name in self.names))


def holds_tcnn(module: nn.Module) -> bool:
    """Whether ``module`` runs a hash encoding on tiny-cuda-nn's kernels for CUDA inputs
    (``backend=tcnn``, or ``auto`` where it resolves to tcnn)."""
    from nerf_lightning.models.encoding import HashEncoding

    if not torch.cuda.is_available():
        return False
    probe = torch.empty(0, 3, device="cuda")
    return any(isinstance(m, HashEncoding) and m.resolve_backend(probe) == "tcnn" for m in module.modules())


def warm_capture_stream(module: nn.Module, args: tuple[Tensor, ...]) -> None:
    """One forward and backward of ``module(*args)`` (its first output) on the stream that
    ``torch.cuda.graph`` captures on, before ``make_graphed_callables``.

    tiny-cuda-nn allocates a workspace per CUDA stream on that stream's first use, and
    ``make_graphed_callables`` warms up on a fresh stream but captures on ``torch.cuda.graph``'s shared
    default capture stream: tcnn's first call there would allocate while capturing, which CUDA refuses
    (the capture is invalidated and tcnn aborts the process). Run here, on that stream and at the
    capture's sizes, the allocation happens before the capture. The gradients are computed with
    ``torch.autograd.grad`` (as ``make_graphed_callables``' own warm-up), so no ``.grad`` is touched.
    """
    stream = torch.cuda.graph.default_capture_stream
    if stream is None:  # created lazily by torch.cuda.graph, exactly so
        stream = torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
    params = [p for p in module.parameters() if p.requires_grad]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = module(*args)
        first = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(first, params, allow_unused=True)
    torch.cuda.current_stream().wait_stream(stream)
