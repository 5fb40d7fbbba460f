"""Training ray samplers: which (view, pixel) pairs make up each ray batch.

Two samplers share one interface (:class:`RaySampler`):

- :class:`UniformRaySampler`: every training pixel equally likely (views in proportion to their
  pixel counts, pixels uniform inside the view).
- :class:`LossWeightedRaySampler`: views drawn in proportion to an exponential moving average
  (EMA) of their per-ray loss, mixed with a uniform floor.

The sampling distribution is kept as a CDF over the views, ``[V]`` float64, so that one
``torch.searchsorted`` on a uniform random tensor draws the view; the pixel is then uniform inside
the view. Nothing in :meth:`RaySampler.sample`, :meth:`RaySampler.update` or
:meth:`RaySampler.step` reads a tensor value on the host, so the training step never waits on the
device.

Contract with the training loop (one optimizer step)::

    view_ids, px, py = sampler.sample(n_rays, generator)   # [n] int64 each, on the sampler's device
    ...                                                      # render, per-ray loss [n]
    sampler.update(view_ids, px, py, per_ray_loss.detach())
    sampler.step(global_step)                               # same global_step on every rank

Distributed: the accumulated loss sums and counts are all-reduced (SUM) once per statistics
window, so every rank holds identical probabilities; randomness stays per rank (pass each rank its
own generator). The loss accumulators are plain tensors rather than registered buffers on purpose:
``DistributedDataParallel(broadcast_buffers=True)`` would otherwise overwrite every rank's partial
sums with rank 0's before each forward. They are still checkpointed (through ``_extra_state``).

All state keeps its dtype under ``module.half()`` / ``.to(torch.bfloat16)`` (e.g. Lightning's
``bf16-true`` precision): only the device follows ``.to()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import torch
import torch.distributed as dist
from torch import Tensor

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Range
from nerf_lightning.data.masks import KeptPixels
from nerf_lightning.ops import data_kernel
from nerf_lightning.training.clock import Tick

__all__ = ["RaySampler", "UniformRaySampler", "LossWeightedRaySampler", "build_sampler", "pixels_of"]

SizeLike = Tensor | Sequence[int]
#: the training views' widths / heights, which the DataModule passes to the factory of ``data.samplers``
Sizes = Annotated[SizeLike, Injected("the DataModule: the training views' sizes")]
#: the training views' kept pixels (captures with masks; ``data/masks.py``), which the DataModule passes
Kept = Annotated[KeptPixels | None, Injected("the DataModule: the training views' masks")]


def _as_sizes(values: SizeLike, name: str) -> Tensor:
    """Validate per-view image sizes: a non-empty 1-D integer sequence of positive values → int64 [V]."""
    t = torch.as_tensor(values)
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(
            f"RaySampler: `{name}` must be a non-empty 1-D sequence (one entry per view), "
            f"got shape {tuple(t.shape)}"
        )
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise ValueError(f"RaySampler: `{name}` must hold integers (pixels), got dtype {t.dtype}")
    t = t.to(torch.int64)
    if bool((t <= 0).any()):  # construction time: a host read is fine here
        raise ValueError(f"RaySampler: `{name}` must be positive, got min {int(t.min())}")
    return t


def _distributed_world() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def pixels_of(
    cdf: Tensor, widths: Tensor, heights: Tensor, u: Tensor, kept: KeptPixels | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(view_ids, px, py) of uniforms ``u`` float64 [3, n]: the view whose interval of ``cdf`` float64 [V]
    holds ``u[0]``, then the pixel at fractions ``u[1]``, ``u[2]`` of its width and height (int64 [V]);
    with ``kept`` (masks), the kept pixel at fraction ``u[1]`` of the view's kept pixels."""
    view_ids = torch.searchsorted(cdf, u[0], right=True).clamp_(max=cdf.numel() - 1)
    if kept is not None:
        return view_ids, *kept.pixels(view_ids, u[1], widths)
    w, h = widths[view_ids], heights[view_ids]
    px = torch.minimum((u[1] * w).long(), w - 1)
    py = torch.minimum((u[2] * h).long(), h - 1)
    return view_ids, px, py


class RaySampler(torch.nn.Module):
    """Base class: draws ``(view_id, px, py)`` from a distribution over the views, pixels uniform inside.

    Args:
        widths: image width in pixels of each training view, int [V] (tensor or sequence).
        heights: image height in pixels of each training view, int [V].
        kept: the views' kept pixels when the capture has masks (``data/masks.py``): a view's pixel count
            is then its kept pixels, and a draw picks only kept pixels (a masked pixel has probability 0).

    Buffers (persistent; moved by ``.to()``, saved by ``state_dict()``):
        widths, heights: int64 [V].
        view_probs: float64 [V], the current probability of drawing each view.
        cdf: float64 [V], cumulative probability of the views, last entry exactly 1.

    Subclasses set the distribution with :meth:`_set_distribution`; :meth:`update` and
    :meth:`step` are no-ops here.
    """

    widths: Tensor
    heights: Tensor
    view_probs: Tensor
    cdf: Tensor
    #: names of plain tensor attributes (not buffers) that must follow the module's device.
    _plain_tensors: tuple[str, ...] = ()

    def __init__(self, widths: Sizes, heights: Sizes, kept: Kept = None) -> None:
        super().__init__()
        w = _as_sizes(widths, "widths")
        h = _as_sizes(heights, "heights").to(w.device)
        if w.shape != h.shape:
            raise ValueError(
                f"RaySampler: `widths` and `heights` need one entry per view, got {w.numel()} "
                f"widths and {h.numel()} heights"
            )
        self.register_buffer("widths", w)
        self.register_buffer("heights", h)
        if kept is not None and kept.counts.numel() != w.numel():
            raise ValueError(f"RaySampler: `kept` has {kept.counts.numel()} views, the sizes {w.numel()}")
        if kept is not None and not bool((kept.counts > 0).any()):
            raise ValueError("RaySampler: every pixel of every training view is masked")
        #: not buffers: they come from the capture's masks, not from a checkpoint
        self.kept = kept.to(w.device) if kept is not None else None
        v = w.numel()
        self.register_buffer("view_probs", torch.zeros(v, dtype=torch.float64, device=w.device))
        self.register_buffer("cdf", torch.zeros(v, dtype=torch.float64, device=w.device))
        self._set_distribution(self._uniform_view_probs())

    # ------------------------------------------------------------------ geometry
    @property
    def num_views(self) -> int:
        return self.widths.numel()

    def _pixel_counts(self) -> Tensor:
        """Pixels per view that may train (all, or the kept ones under masks), float64 [V]."""
        if self.kept is not None:
            return self.kept.counts.to(torch.float64)
        return (self.widths * self.heights).to(torch.float64)

    def _uniform_view_probs(self) -> Tensor:
        """Views in proportion to their pixel counts (uniform over all training pixels), float64 [V]."""
        n = self._pixel_counts()
        return n / n.sum()

    # ------------------------------------------------------------------ distribution
    @torch.no_grad()
    def _set_distribution(self, view_probs: Tensor) -> None:
        """Install new view probabilities, float64 [V] summing to 1 (device-only, no host sync)."""
        cdf = torch.cumsum(view_probs, 0)
        cdf = cdf / cdf[-1]
        # exact top so that every u in [0, 1) lands inside; fill_ on a view (index_put of a python
        # scalar copies it host-to-device synchronously)
        cdf[-1:].fill_(1.0)
        self.view_probs.copy_(view_probs)
        self.cdf.copy_(cdf)

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def sample(self, n_rays: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Draw ``n_rays`` training pixels (with replacement), without any host synchronization.

        Args:
            n_rays: number of rays to draw.
            generator: random generator on the sampler's device (use a different seed per rank);
                None uses the global generator of that device.

        Returns:
            view_ids: int64 [n_rays], index into the training views.
            px: int64 [n_rays], pixel column in ``[0, widths[view_ids])``.
            py: int64 [n_rays], pixel row in ``[0, heights[view_ids])``.
            All on the buffers' device.
        """
        if n_rays < 0:
            raise ValueError(f"RaySampler.sample: n_rays must be >= 0, got {n_rays}")
        dev = self.cdf.device
        if generator is not None and generator.device.type != dev.type:
            raise ValueError(
                f"RaySampler.sample: the generator is on {generator.device} but the sampler "
                f"state is on {dev}; create it with torch.Generator(device='{dev.type}')"
            )
        # float64: the view CDF resolves small probabilities and floor(u * w) stays inside the image
        u = torch.rand(3, n_rays, generator=generator, device=dev, dtype=torch.float64)
        kernel = data_kernel("sample_pixels", u, self.cdf) if self.kept is None else None
        if kernel is not None:  # _pixels_of in one kernel (about 20 fewer launches per batch)
            return kernel(u, self.cdf, self.widths, self.heights, 1)  # one cell per view
        return self._pixels_of(u)

    def _pixels_of(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(view_ids, px, py) of uniforms ``u`` float64 [3, n]: the view whose CDF interval holds ``u[0]``,
        then the pixel at fractions ``u[1]``, ``u[2]`` of its width and height."""
        return pixels_of(self.cdf, self.widths, self.heights, u, self.kept)

    def update(
        self, view_ids: Tensor, px: Tensor, py: Tensor, losses: Tensor, valid: Tensor | None = None
    ) -> None:
        """Accumulate per-ray losses (no-op for samplers without statistics).

        Args:
            view_ids, px, py: int64 [n], as returned by :meth:`sample`.
            losses: float [n], detached per-ray loss.
            valid: bool [n] or None; rays left out of the step (a sample budget) are not counted.
        """

    def step(self, global_step: int | Tick) -> None:
        """Called once per optimizer step after :meth:`update` (no-op for samplers without statistics);
        ``global_step`` is the step count or the training clock's tick of the step (``training/clock.py``)."""

    def view_probabilities(self) -> Tensor:
        """Current probability of drawing each view, float32 [V] (a copy; for logging)."""
        return self.view_probs.to(torch.float32)

    # ------------------------------------------------------------------ nn.Module plumbing
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> RaySampler:
        # Only follow the device: a dtype cast (module.half(), bf16-true precision) would wreck the
        # float64 CDF and the integer sizes. A zero-size probe tells where ``fn`` sends tensors.
        device = fn(torch.empty(0, device=self.widths.device)).device
        for name, buf in self._buffers.items():
            if buf is not None:
                self._buffers[name] = buf.to(device)
        for name in self._plain_tensors:
            setattr(self, name, getattr(self, name).to(device))
        if self.kept is not None:
            self.kept = self.kept.to(device)
        return self

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        keys = (prefix + "widths", prefix + "heights")
        if all(k in state_dict for k in keys):
            theirs = (state_dict[keys[0]].cpu(), state_dict[keys[1]].cpu())
            ours = (self.widths.cpu(), self.heights.cpu())
            if theirs[0].shape != ours[0].shape or not all(map(torch.equal, theirs, ours)):
                error_msgs.append(
                    f"the checkpoint's {theirs[0].numel()} training views are {_sizes(*theirs)}, this run's "
                    f"{ours[0].numel()} are {_sizes(*ours)}: were the capture, its train split or "
                    "data.downscale changed?"
                )
                return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return f"views={self.num_views}"


def _sizes(widths: Tensor, heights: Tensor) -> str:
    """``40x40 pixels``, or ``3 sizes from 20x15 to 40x30 pixels``."""
    pairs = sorted({(int(w), int(h)) for w, h in zip(widths.tolist(), heights.tolist(), strict=True)})
    if not pairs:
        return "none"
    if len(pairs) == 1:
        return f"{pairs[0][0]}x{pairs[0][1]} pixels"
    return f"{len(pairs)} sizes from {pairs[0][0]}x{pairs[0][1]} to {pairs[-1][0]}x{pairs[-1][1]} pixels"


class UniformRaySampler(RaySampler):
    """Every training pixel equally likely: views in proportion to pixel count, pixels uniform inside.

    Args:
        widths: image width of each training view, int [V].
        heights: image height of each training view, int [V].
        kept: the views' kept pixels under masks (:class:`RaySampler`).
    """

    def __init__(self, widths: Sizes, heights: Sizes, kept: Kept = None) -> None:
        super().__init__(widths=widths, heights=heights, kept=kept)


class LossWeightedRaySampler(RaySampler):
    """Views drawn in proportion to a per-view loss EMA, with a uniform floor and a warmup.

    Each view's weight is ``(ema_v + eps * mean_u(ema_u)) ** alpha``, times its pixel count when
    ``scale_by_pixel_count`` (so that equal losses, or ``alpha = 0``, give exactly the uniform
    sampler). ``eps`` is *relative* to the mean EMA over views, which makes it independent of the
    loss scale (a photometric MSE drops by orders of magnitude during training). The final view
    probabilities are ``p = (1 - f) * p_w + f * p_uniform`` with ``f = uniform_floor`` and
    ``p_uniform`` the pixel-count-proportional distribution of :class:`UniformRaySampler`; so every
    view keeps at least ``f * p_uniform`` however small its loss.

    Statistics: :meth:`update` scatter-adds each ray's loss and a count into per-view accumulators.
    Every ``update_every`` optimizer steps (a window), :meth:`step` all-reduces the accumulators across
    ranks (when ``torch.distributed`` runs with more than one process), folds
    each window mean into the EMA (``ema = decay * ema + (1 - decay) * mean``; a view's first
    window initializes it; views not seen in a window keep their EMA) and recomputes the
    probabilities. Views never seen yet count as the mean of the views seen (neither starved nor
    favoured). During the first ``warmup_steps`` steps sampling stays uniform while the EMA fills;
    the weighted distribution takes over right at step ``warmup_steps``.

    Args:
        widths, heights: image size of each training view, int [V].
        alpha: exponent on the loss (0 = uniform, 1 = proportional to loss).
        eps: additive floor on each EMA, relative to the mean EMA over views.
        uniform_floor: fraction f in [0, 1] of the probability mass spread uniformly over pixels.
        ema_decay: EMA decay per statistics window, in [0, 1).
        warmup_steps: optimizer steps of uniform sampling before the weights are used.
        update_every: statistics window in optimizer steps (one all-reduce per window).
        scale_by_pixel_count: multiply view weights by pixel count (see above); False gives
            ``p_w ∝ (ema + eps) ** alpha`` per view regardless of image size.
        kept: the views' kept pixels under masks (:class:`RaySampler`): the pixel counts are the kept
            ones, and a wholly masked view has weight 0 either way.
    """

    ema: Tensor
    seen: Tensor
    _plain_tensors = ("_acc_sum", "_acc_cnt")

    def __init__(
        self,
        widths: Sizes,
        heights: Sizes,
        alpha: Annotated[float, Range(low=0)] = 1.0,
        eps: Annotated[float, Range(low=0)] = 1e-3,
        uniform_floor: Annotated[float, Range(low=0, high=1)] = 0.2,
        ema_decay: Annotated[float, Range(low=0, below=1)] = 0.9,
        warmup_steps: Annotated[int, Range(low=0)] = 256,
        update_every: Annotated[int, Range(low=1)] = 16,
        scale_by_pixel_count: bool = True,
        kept: Kept = None,
    ) -> None:
        check_arguments(LossWeightedRaySampler, locals())
        super().__init__(widths=widths, heights=heights, kept=kept)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.uniform_floor = float(uniform_floor)
        self.ema_decay = float(ema_decay)
        self.warmup_steps = int(warmup_steps)
        self.update_every = int(update_every)
        self.scale_by_pixel_count = bool(scale_by_pixel_count)
        v, dev = self.num_views, self.widths.device
        self.register_buffer("ema", torch.zeros(v, dtype=torch.float64, device=dev))
        self.register_buffer("seen", torch.zeros(v, dtype=torch.bool, device=dev))
        # float32 sums / int64 counts: cheap atomics in the hot path; widened to float64 to all-reduce.
        self._acc_sum = torch.zeros(v, dtype=torch.float32, device=dev)
        self._acc_cnt = torch.zeros(v, dtype=torch.int64, device=dev)

    @torch.no_grad()
    def update(
        self, view_ids: Tensor, px: Tensor, py: Tensor, losses: Tensor, valid: Tensor | None = None
    ) -> None:
        """Scatter-add per-ray losses into the per-view accumulators; no host synchronization.

        Args:
            view_ids: int64 [n] view of each ray.
            px, py: int64 [n] pixel column / row (the sampler's interface; the statistics are per view).
            losses: float [n] per-ray loss (any float dtype; detached here).
            valid: bool [n] or None; rays with ``valid`` False add neither loss nor count.
        """
        n = view_ids.shape
        if view_ids.ndim != 1 or px.shape != n or py.shape != n or losses.shape != n:
            raise ValueError(
                "LossWeightedRaySampler.update: view_ids, px, py and losses must be 1-D of one length, got "
                f"{tuple(view_ids.shape)}, {tuple(px.shape)}, {tuple(py.shape)}, {tuple(losses.shape)}"
            )
        dev = self._acc_sum.device
        idx = view_ids.to(dev, torch.int64)
        losses = losses.detach().to(dev, torch.float32)
        ones = torch.ones_like(idx)
        if valid is not None:
            valid = valid.to(dev)
            losses, ones = losses * valid, ones * valid
        self._acc_sum.index_add_(0, idx, losses)
        self._acc_cnt.index_add_(0, idx, ones)

    @torch.no_grad()
    def step(self, global_step: int | Tick) -> None:
        """End of optimizer step ``global_step`` (0-based). Every ``update_every`` steps (and at the end of
        warmup) all-reduce the accumulators across ranks, fold them into the EMA, recompute the
        probabilities. Collective: every rank must run it with the same ``global_step`` sequence.

        A :class:`~nerf_lightning.training.clock.Tick` counts the cadence and the warm-up in the clock's
        reference steps: a step that spans several of them folds at most one window."""
        tick = global_step if isinstance(global_step, Tick) else Tick.of_step(global_step)
        # steps done before and after this one, in the counting above
        before, done = tick.start + 1, tick.end + 1
        window = Tick(tick.step, before, done)
        if not window.crossed(self.update_every) and not window.reached(self.warmup_steps):
            return
        window_sums = torch.stack([self._acc_sum.to(torch.float64), self._acc_cnt.to(torch.float64)])
        if _distributed_world():  # one collective for both
            dist.all_reduce(window_sums, op=dist.ReduceOp.SUM)
        self._acc_sum.zero_()
        self._acc_cnt.zero_()
        sums, counts = window_sums.unbind()
        self._fold(sums.view_as(self.ema), counts.view_as(self.ema))
        self._recompute(weighted=done >= self.warmup_steps - 1e-9)

    def _fold(self, sums: Tensor, counts: Tensor) -> None:
        """Fold one window's sums / counts (float64 [V]) into the EMA."""
        mean = sums / counts.clamp_min(1)
        hit = (counts > 0) & torch.isfinite(mean)  # a non-finite loss must not poison the weights
        d = self.ema_decay
        new = torch.where(self.seen, d * self.ema + (1 - d) * mean, mean)
        self.ema.copy_(torch.where(hit, new, self.ema))
        self.seen |= hit

    def _view_ema(self) -> tuple[Tensor, Tensor]:
        """Per-view EMA, float64 [V] (unseen views filled with the mean of seen views), and that mean []."""
        n_seen = self.seen.sum()
        mean = torch.where(n_seen > 0, (self.ema * self.seen).sum() / n_seen.clamp_min(1), 1.0)
        return torch.where(self.seen, self.ema, mean), mean

    def _recompute(self, weighted: bool) -> None:
        if not weighted:
            self._set_distribution(self._uniform_view_probs())
            return
        f = self.uniform_floor
        p_uni = self._uniform_view_probs()
        ema, mean = self._view_ema()
        w = (ema + self.eps * mean).clamp_min(0) ** self.alpha
        if self.scale_by_pixel_count:
            w = w * self._pixel_counts()
        elif self.kept is not None:
            w = w * (self.kept.counts > 0)  # a wholly masked view has no pixel to draw
        total = w.sum()
        p_w = torch.where(torch.isfinite(total) & (total > 0), w / total, p_uni)  # all-zero losses → uniform
        self._set_distribution((1 - f) * p_w + f * p_uni)

    # checkpoint the in-flight window too, so a resume mid-window loses nothing
    def get_extra_state(self) -> dict[str, Tensor]:
        return {"acc_sum": self._acc_sum.clone(), "acc_cnt": self._acc_cnt.clone()}

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        for key, dst in (("acc_sum", self._acc_sum), ("acc_cnt", self._acc_cnt)):
            src = state[key]
            if src.shape != dst.shape:
                raise RuntimeError(
                    f"LossWeightedRaySampler: checkpoint `{key}` has shape "
                    f"{tuple(src.shape)}, expected {tuple(dst.shape)} "
                    "(the training views changed?)"
                )
            dst.copy_(src)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, alpha={self.alpha}, eps={self.eps}, "
            f"uniform_floor={self.uniform_floor}, ema_decay={self.ema_decay}, "
            f"warmup_steps={self.warmup_steps}, update_every={self.update_every}"
        )


SAMPLERS: dict[str, type[RaySampler]] = {
    "uniform": UniformRaySampler,
    "loss_weighted": LossWeightedRaySampler,
}


def build_sampler(name: str, widths: SizeLike, heights: SizeLike, **kwargs: Any) -> RaySampler:
    """Build a sampler by name: ``"uniform"`` or ``"loss_weighted"`` (kwargs go to its constructor)."""
    try:
        cls = SAMPLERS[name]
    except KeyError:
        raise ValueError(
            f"build_sampler: unknown sampler {name!r}; expected one of {sorted(SAMPLERS)}"
        ) from None
    return cls(widths=widths, heights=heights, **kwargs)
