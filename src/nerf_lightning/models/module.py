"""The LightningModule: rays -> packed samples -> field -> compositing -> loss, and validation renders."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.metrics import METRICS, ViewMetrics, ngp_composite
from nerf_lightning.models.train_step import FixedBudgetStep, autocast_for, capture
from nerf_lightning.ops.reference import per_ray_loss
from nerf_lightning.run.strategies import fsdp_full_copy, throttle_sigterm_broadcast
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.training.lr_schedules import on_clock, with_group_lambdas
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import Renderer, build_renderer, opacity_error, ray_distortion

log = logging.getLogger(__name__)

#: Under batch_rule=throughput a rank may take up to this many times its even share.
THROUGHPUT_HEADROOM = 1.5
#: ``model.alpha_weight=auto`` for renders: lego over black gains 7.4 dB at 20k steps for no loss over
#: white (docs/real_captures.md, section 8); photographs have no transparent pixels to learn from.
RENDER_ALPHA_WEIGHT = 0.1


class NeRFModule(L.LightningModule):
    """instant-ngp NeRF training as a LightningModule.

    Args:
        field: factory (Hydra ``_partial_``) of the radiance field, called with ``aabb_scale``.
        optimizer: factory of the optimizer, called with parameter groups.
        renderer: factory of the :class:`~nerf_lightning.volume.renderer.Renderer` (``model.renderer``:
            ``volume/renderer.py``'s ``build_renderer`` with its ``occupancy`` grid, whose update schedule
            this module follows), called with ``aabb_scale``. None: instant-ngp's defaults.
        scheduler: factory called with ``(optimizer, total_steps)``; stepped every optimizer step.
        step: factory of the budgeted training step (``model.step``: ``models/train_step.py``'s
            ``budgeted_step``), called with the field, the renderer, the loss and the per-view
            components; it may return None (no sample budget). None: ``data.batch_size`` rays per step
            with data-dependent shapes.
        aabb_scale: outer box size (from the capture; see ``data/types.py``).
        loss: ``huber`` (instant-ngp's NeRF default, delta 0.1) or ``mse``.
        distortion_weight: weight of mip-NeRF 360's distortion loss (mean over the rays) added to the
            photometric loss; 0 (default) leaves it out.
        alpha_weight: weight of the opacity loss, the mean over the rays of ``(opacity - alpha)^2``
            against the training images' alpha (the batch's ``alpha``: captures whose images carry
            alpha only). A training background the colour of the evaluation background never charges
            faint density in empty space (invisible over that background, visible over any other);
            this does. ``auto`` (``model.alpha_weight``'s default): :data:`RENDER_ALPHA_WEIGHT` for
            renders, 0 for photographs (``photograph``). 0: off. The resolved weight is
            :attr:`alpha_weight`.
        cuda_graph: ``auto`` (capture the budgeted step as CUDA graphs on a GPU, except under FSDP,
            whose parameters are re-gathered every step), ``true`` or ``false``.
        jitter: shift each training ray's first sample by a random fraction of a step (off only for
            deterministic comparisons).
        sigterm_check_every: under DDP/FSDP, Lightning checks every step whether a rank received
            SIGTERM, with a broadcast and a host sync; this runs it every N optimizer steps instead
            (a SIGTERM is then honoured within N steps).
        val_chunk: rays per chunk when rendering validation images.
        save_val_images: write ``val/view{v}_step{s}.png`` (GT | prediction | depth | error).
        lpips: LPIPS in the evaluation metrics: ``null`` (VGG, as nerfacc, when its weights are local),
            ``false``, or a torchmetrics net name (``vgg``, ``alex``, ``squeeze``).
        camera_opt: factory of the learned camera-pose corrections (``models/camera_opt.py``), called
            with ``n_views``, ``poses`` and ``photograph``; kept only when it is enabled. None: off.
        appearance: factory of the learned per-view exposure (``models/appearance.py``), called with
            ``n_views`` and ``photograph``; kept only when it is enabled. None: off.
        n_train_views: training views of the capture (``train`` passes it; the per-view components'
            sizes).
        train_poses: float [V, 3, 4] NGP-space given poses of the training views (``train`` passes
            them; the camera corrections' gauge). None when the state is loaded from a checkpoint next.
        photograph: whether the capture is photographs (the components' ``enabled=auto`` and
            ``alpha_weight=auto``).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback`, shared with the
            DataModule (the train app makes it): its training clock (``batch_rule``: this rank's batch,
            and the reference position that the learning-rate schedule, the sampler's windows and the
            run's length follow), where each step's per-ray losses go (the ray sampler), this rank's
            work share under ``batch_rule=throughput`` without a sample budget, and the training
            cameras, whose unseen cells the occupancy grid marks at the first step. None: one process's
            clock of optimizer steps and a feedback attached to nothing.

    Evaluation (``validation_step`` / ``test_step``, one whole held-out image per batch): PSNR, SSIM
    (and LPIPS) per image, logged at the end of the pass as their means over the views
    (``val/psnr`` ... and ``test/psnr`` ...; see ``models/metrics.py``). The full result of the last
    pass of each stage, per-view numbers included, is kept in :attr:`eval_results`.
    """

    def __init__(
        self,
        field: Callable[..., NGPField],
        optimizer: Callable[..., torch.optim.Optimizer],
        renderer: Callable[..., Renderer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        step: Callable[..., FixedBudgetStep | None] | None = None,
        aabb_scale: int = 1,
        loss: str = "huber",
        huber_delta: float = 0.1,
        distortion_weight: float = 0.0,
        alpha_weight: float | str = 0.0,
        cuda_graph: bool | str = "auto",
        jitter: bool = True,
        sigterm_check_every: int = 100,
        val_chunk: int = 1 << 15,
        save_val_images: bool = True,
        lpips: bool | str | None = None,
        camera_opt: Callable[..., CameraOptimizer] | None = None,
        appearance: Callable[..., PerViewExposure] | None = None,
        n_train_views: int = 0,
        train_poses: Tensor | None = None,
        photograph: bool = False,
        feedback: TrainingFeedback | None = None,
    ) -> None:
        super().__init__()
        # Factories are not saved: checkpoints must load with torch.load(weights_only=True), Lightning's
        # default when resuming (`ckpt_path=`); the run's .hydra/config.yaml records them.
        factories = ["field", "optimizer", "renderer", "scheduler", "step", "camera_opt", "appearance"]
        self.save_hyperparameters(logger=False, ignore=[*factories, "train_poses", "feedback"])
        if loss not in ("huber", "mse"):
            raise ValueError(f"model.loss must be 'huber' or 'mse', got {loss!r}")
        self.field = field(aabb_scale=aabb_scale)
        # Under FSDP, evaluation renders with a plain full copy of the field (fsdp_full_copy); the
        # factory builds it. Neither is a registered submodule (no parameters, no state-dict entries).
        object.__setattr__(self, "_field_factory", field)
        self._eval_field: nn.Module | None
        object.__setattr__(self, "_eval_field", None)
        self.renderer = (renderer or build_renderer)(aabb_scale=aabb_scale)
        #: the opacity loss's weight, ``model.alpha_weight`` resolved (0: off, the batches carry no alpha)
        self.alpha_weight = _resolve_alpha_weight(alpha_weight, photograph)
        if cuda_graph not in (True, False, "auto"):
            raise ValueError(f"model.cuda_graph must be true, false or auto, got {cuda_graph!r}")
        # Learned per-training-view state: submodules (state dict, parameters, DDP) only when enabled.
        self.camera_opt: CameraOptimizer | None = _if_enabled(
            camera_opt, n_views=n_train_views, poses=train_poses, photograph=photograph
        )
        self.appearance: PerViewExposure | None = _if_enabled(
            appearance, n_views=n_train_views, photograph=photograph
        )
        train_step = None
        if step is not None:
            train_step = step(
                self.field,
                self.renderer,
                loss,
                huber_delta,
                jitter=jitter,
                distortion_weight=distortion_weight,
                alpha_weight=self.alpha_weight,
                camera_opt=self.camera_opt,
                appearance=self.appearance,
            )
        # Not a registered submodule: it shares the field and renderer, which must appear once in
        # the state dict and the parameter list.
        self.train_step_fn: nn.Module | None
        object.__setattr__(self, "train_step_fn", train_step)
        self._graphed = False
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.feedback = feedback if feedback is not None else TrainingFeedback()
        self.clock = self.feedback.clock
        self.val_metrics = ViewMetrics(lpips=lpips)
        self.test_metrics = ViewMetrics(lpips=lpips)
        #: stage ("val" / "test") -> last ViewMetrics.compute() result of that stage (rank 0 has all views)
        self.eval_results: dict[str, dict[str, Any]] = {}
        # Device-side counters read by the throughput callback (no host sync in the step).
        self.register_buffer("rays_seen", torch.zeros((), dtype=torch.float64), persistent=False)
        self.register_buffer("samples_seen", torch.zeros((), dtype=torch.float64), persistent=False)

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets `_current_fx_name` before and after every hook it calls, about 36 times a training
        # step, and nn.Module.__setattr__ first searches the parameters, buffers and submodules each time:
        # host time, which sets the loop's pace below the full batch (run/loop.py). A hook's name is none
        # of those.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def occupancy(self) -> OccupancyGrid:
        """The renderer's occupancy grid (one instance; saved under ``renderer.occupancy.*``)."""
        return self.renderer.occupancy

    # ---------------------------------------------------------------------------- training
    def setup(self, stage: str) -> None:
        if stage == "fit":
            trainer = self.trainer
            max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
            self.clock.bind(trainer.world_size, trainer.accumulate_grad_batches, max_steps)

    def on_fit_start(self) -> None:
        # Same initial weights everywhere (the strategy broadcasts them), different rays per rank.
        seed = torch.initial_seed() % (2**31)
        torch.manual_seed(seed + 1000 * self.global_rank)
        if self.train_step_fn is not None:
            self.train_step_fn.to(self.device)  # its own buffers (n_active); not a registered child
            self._scale_budget_to_ranks()
        self._follow_clock_length()
        if self.trainer.world_size > 1:
            throttle_sigterm_broadcast(self.trainer, every_n_steps=self.hparams.sigterm_check_every)
        cameras = self.feedback.cameras
        if cameras is not None and self.global_step == 0:
            self.occupancy.mark_invisible_cells(
                cameras.poses.to(self.device),
                cameras.intrinsics.to(self.device),
                cameras.widths.to(self.device),
                cameras.heights.to(self.device),
            )

    def _step_buffers(self) -> dict[str, Tensor]:
        step = self.train_step_fn
        return {name: getattr(step, name) for name in ("n_active", "n_active_f") if hasattr(step, name)}

    def _scale_budget_to_ranks(self) -> None:
        """Per-rank sample budget under the batch rule (before the step is captured)."""
        if self._graphed:
            return
        clock, step = self.clock, self.train_step_fn
        if clock.splits_by_throughput:
            step.set_capacity_scale(clock.rank_multiple * THROUGHPUT_HEADROOM, 1.0 / THROUGHPUT_HEADROOM)
        else:
            step.set_capacity_scale(clock.rank_multiple)
        step.set_clock_rate(clock.rate)

    def _follow_clock_length(self) -> None:
        """When the schedules count rays, ``trainer.max_steps`` counts reference steps: the run ends after
        the optimizer steps that see as many rays (``TrainingClock.optimizer_steps``)."""
        steps = self.clock.optimizer_steps()
        if steps is None or steps == self.trainer.max_steps:
            return
        self.trainer.fit_loop.epoch_loop.max_steps = steps
        if self.trainer.is_global_zero:
            log.info(
                "batch_rule=%s: %d optimizer steps of %.4g reference batches see the rays of "
                "trainer.max_steps=%d reference steps",
                self.clock.rule.name,
                steps,
                self.clock.k,
                self.clock.total,
            )

    def set_work_scale(self, scale: float) -> None:
        """This rank's share of the work (mean 1 over the ranks) under ``batch_rule=throughput``:
        the fraction of the sample budget its ray count aims at, or its rays per step."""
        if self.train_step_fn is not None:
            self.train_step_fn.target_fraction.fill_(min(scale, THROUGHPUT_HEADROOM) / THROUGHPUT_HEADROOM)
        else:
            self.feedback.work_scale = float(scale)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if self.train_step_fn is not None:
            return self._budgeted_training_step(batch)
        rays_o, rays_d, view_ids = batch["rays_o"], batch["rays_d"], batch["view_ids"]
        if self.camera_opt is not None:
            rays_o, rays_d = self.camera_opt(view_ids, rays_o, rays_d)
        out = self.renderer.render_rays(
            self.field, rays_o, rays_d, batch["background"], jitter=self.hparams.jitter
        )
        if self.appearance is not None:
            out["rgb"] = self.appearance(view_ids, out["rgb"], out["opacity"], batch["background"])
        per_ray = per_ray_loss(out["rgb"], batch["rgb"], self.hparams.loss, self.hparams.huber_delta)
        loss = per_ray.mean()
        if self.hparams.distortion_weight > 0:
            dist = ray_distortion(out, self.renderer.ops)
            loss = loss + self.hparams.distortion_weight * dist.mean()
        if self.alpha_weight > 0:
            loss = loss + self.alpha_weight * opacity_error(out, _batch_alpha(batch)).mean()
        self.feedback.report_losses(batch["view_ids"], batch["px"], batch["py"], per_ray.detach())
        self.rays_seen += per_ray.shape[0]
        self.samples_seen += out["n_samples"].detach().to(torch.float64)
        if self._logging_step():
            mse = ((out["rgb"].detach() - batch["rgb"]) ** 2).mean()
            self.log("train/loss", loss.detach())
            self.log("train/psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)))
        return loss

    def step_inputs(self, batch: dict[str, Any]) -> tuple[Tensor, ...]:
        """The budgeted step's inputs from a training batch: rays, targets and background, then the
        rays' views when per-view components or the opacity loss read them, then the rays' ``alpha``
        when the opacity loss is on (``train_step_fn``'s signature, static inputs of its CUDA graph)."""
        args = (batch["rays_o"], batch["rays_d"], batch["rgb"], batch["background"])
        if self.view_components or self.alpha_weight > 0:
            args = (*args, batch["view_ids"])
        if self.alpha_weight > 0:
            args = (*args, _batch_alpha(batch))
        return args

    def _budgeted_training_step(self, batch: dict[str, Any]) -> Tensor:
        args = self.step_inputs(batch)
        step = self.train_step_fn
        if not self._graphed and self._use_cuda_graph():
            # share_inputs: the batch graph's output buffers become the step graph's inputs (no
            # copies per step); an eager batch is copied into the first batch's tensors, unused by then
            step = capture(
                step, args, self.trainer.precision, alias_gradients=self._alias_gradients(), share_inputs=True
            )
            object.__setattr__(self, "train_step_fn", step)
            self._graphed = True
        with autocast_for(self.trainer.precision) if self._graphed else nullcontext():
            loss, per_ray, valid, stats = step(*args)
        # The graphed step returns every float output as requiring grad. Summed into the run's
        # counters as they are, each step's autograd graph would stay alive from step to step.
        per_ray, stats = per_ray.detach(), stats.detach()
        self.feedback.report_losses(batch["view_ids"], batch["px"], batch["py"], per_ray, valid=valid)
        self.rays_seen += stats[0]
        self.samples_seen += stats[1]
        if self._logging_step():
            mse = stats[3] / stats[0].clamp_min(1.0)
            self.log("train/loss", loss.detach())
            self.log("train/psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)).float())
            self.log("train/rays_per_step", stats[0].float())
        return loss

    def _logging_step(self) -> bool:
        """Whether the loggers write this step. ``self.log`` costs a host->device copy (a sync)
        every time in Lightning, so the hot path logs only on the steps that are written."""
        connector = getattr(self.trainer, "_logger_connector", None)
        return bool(getattr(connector, "should_update_logs", True))

    def _use_cuda_graph(self) -> bool:
        mode = self.hparams.cuda_graph
        if mode is False or self.device.type != "cuda":
            return False
        from lightning.pytorch.strategies import FSDPStrategy

        return not isinstance(self.trainer.strategy, FSDPStrategy)

    def _alias_gradients(self) -> bool:
        """Whether the graphed step's gradient buffers become ``.grad`` (see ``train_step.capture``):
        on one device without gradient accumulation. Under DDP the reducer's hooks on the
        accumulation keep the proven pre-allocated path."""
        return self.trainer.accumulate_grad_batches == 1 and self.trainer.world_size == 1

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        # Graphed and accumulating: the replays write gradients into static buffers that autograd
        # adds to `.grad`; keep the `.grad` tensors (zeroed in place) so that they never alias those
        # buffers. Otherwise None: eager autograd allocates, the graphed step aliases its buffers.
        accumulates_into_grad = self._graphed and not self._alias_gradients()
        optimizer.zero_grad(set_to_none=not accumulates_into_grad)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches != 0:
            return  # only after a real optimizer step
        tick = self.clock.tick(self.global_step)
        self.feedback.step(tick)
        # the grid keeps its cadence in optimizer steps under every batch rule (training/batch_rules.py)
        if self.global_step % self.occupancy.update_every == 0:
            # Each rank evaluates its share of the cells and the maximum over the ranks merges them:
            # N ranks sample the grid as one process does, in 1/N of its time each.
            world = self.trainer.world_size
            with self._full_parameters():
                self.occupancy.update(self.global_step, self.field.density, share=(self.global_rank, world))
            if world > 1:
                self.occupancy.sync_(_all_reduce_max)

    def _full_parameters(self) -> Any:
        """A context in which the field holds its whole hash table.

        FSDP keeps only this rank's shard of each parameter between forward passes; the occupancy
        update evaluates the field outside one, so the table is gathered for it (every rank takes
        part: the update runs on the same steps everywhere)."""
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = self.trainer.strategy
        if not isinstance(strategy, FSDPStrategy):
            return nullcontext()
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(strategy.model, writeback=False)

    # -------------------------------------------------------------------------- evaluation
    def render_view(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Render one whole held-out view batch (``NeRFDataModule.val_batch`` layout).

        Held-out and novel views are rendered with their given poses and the neutral exposure (nothing
        applied, see ``models/appearance.py``); a training view (``batch["train_view"]`` >= 0, e.g.
        under ``data.val_split=train``) with its own learned pose correction and exposure.

        Returns:
            ``rgb`` prediction [H, W, 3] in [0, 1] over the batch's background, ``gt`` ground truth
            [H, W, 3], ``depth`` [H, W] (weighted sample distance, not normalized by opacity),
            ``opacity`` [H, W] and ``ngp``: (prediction, ground truth) as instant-ngp scores them
            (``metrics.ngp_composite``), when the batch carries the image's ``alpha``.
        """
        h, w = batch["height"], batch["width"]
        field = self._eval_field if self._eval_field is not None else self.field
        rays_o, rays_d, background = batch["rays_o"], batch["rays_d"], batch["background"]
        train_view = int(batch.get("train_view", -1))
        view_ids = torch.full((rays_o.shape[0],), max(train_view, 0), dtype=torch.long, device=rays_o.device)
        if train_view >= 0 and self.camera_opt is not None:
            rays_o, rays_d = self.camera_opt(view_ids, rays_o, rays_d)
        out = self.renderer.render_image(field, rays_o, rays_d, background, chunk=self.hparams.val_chunk)
        if train_view >= 0 and self.appearance is not None:
            out["rgb"] = self.appearance(view_ids, out["rgb"], out["opacity"], background)
        view = {
            "rgb": out["rgb"].reshape(h, w, 3).clamp(0, 1),
            "gt": batch["rgb"].reshape(h, w, 3),
            "depth": out["depth"].reshape(h, w),
            "opacity": out["opacity"].reshape(h, w),
        }
        if "alpha" in batch:
            background = batch["background"][0]
            view["ngp"] = (
                ngp_composite(view["rgb"], view["opacity"], background),
                ngp_composite(view["gt"], batch["alpha"].reshape(h, w), background),
            )
        return view

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        view = self.render_view(batch)
        self.val_metrics.update(view["rgb"], view["gt"], batch["view"], ngp=view.get("ngp"))
        if self.hparams.save_val_images and batch_idx == 0 and self.trainer.is_global_zero:
            self._save_panel(batch["view"], view["gt"], view["rgb"], view["depth"])
        # for callbacks (eval writes every view): prediction [H, W, 3], depth and opacity [H, W]
        return {k: view[k] for k in ("rgb", "depth", "opacity")}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        view = self.render_view(batch)
        self.test_metrics.update(view["rgb"], view["gt"], batch["view"], ngp=view.get("ngp"))
        return {k: view[k] for k in ("rgb", "depth", "opacity")}

    def on_validation_epoch_start(self) -> None:
        self._gather_eval_field()

    def on_test_epoch_start(self) -> None:
        self._gather_eval_field()

    def on_validation_epoch_end(self) -> None:
        object.__setattr__(self, "_eval_field", None)
        self._log_eval("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        object.__setattr__(self, "_eval_field", None)
        self._log_eval("test", self.test_metrics)

    def _gather_eval_field(self) -> None:
        """Under FSDP, the field's full copy that this evaluation epoch renders with (every rank)."""
        factory = self._field_factory
        copy = fsdp_full_copy(self.trainer, self.field, lambda: factory(aabb_scale=self.hparams.aabb_scale))
        object.__setattr__(self, "_eval_field", copy)

    def _log_eval(self, stage: str, metrics: ViewMetrics) -> None:
        """Log the means of one evaluation pass (already gathered over ranks) and keep the result."""
        if not metrics.update_count:
            return  # no evaluation batch ran (e.g. limit_val_batches=0)
        result = metrics.compute()
        metrics.reset()
        self.eval_results[stage] = result
        for name in METRICS:
            if name in result:
                # every rank holds the gathered mean, so no further reduction
                self.log(f"{stage}/{name}", result[name], prog_bar=name == "psnr", sync_dist=False)

    def _save_panel(self, view: int, gt: Tensor, pred: Tensor, depth: Tensor) -> None:
        """GT | prediction | depth | error as one PNG under ``<run>/val/``, and on the logger."""
        import imageio.v3 as iio

        d = depth / depth.max().clamp_min(1e-6)
        err = (pred - gt).abs().mean(-1).clamp(0, 0.25) / 0.25
        panel = torch.cat([gt, pred, d[..., None].expand(-1, -1, 3), err[..., None].expand(-1, -1, 3)], dim=1)
        image = (panel.detach().float().cpu().numpy() * 255).round().astype(np.uint8)
        run_dir = Path(self.trainer.default_root_dir)
        out_dir = run_dir / "val"
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"view{view:03d}_step{self.global_step:06d}.png"
        iio.imwrite(path, image)
        for logger in self.loggers:
            log_image = getattr(logger, "log_image", None)
            if callable(log_image):
                log_image(
                    key="val/panel",
                    images=[image],
                    step=self.global_step,
                    caption=["GT | prediction | depth | error"],
                )

    # --------------------------------------------------------------------------- optimizer
    @property
    def view_components(self) -> list[CameraOptimizer | PerViewExposure]:
        """The enabled per-training-view components (camera corrections, exposure), in group order."""
        return [c for c in (self.camera_opt, self.appearance) if c is not None]

    def view_summary(self) -> dict[str, float]:
        """Sizes of the learned corrections and exposures (``metrics.json``)."""
        return {k: v for c in self.view_components for k, v in c.summary().items()}

    def parameter_groups(self, total_steps: int = 10_000) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: the field's hash table (named ``table``), the field's
        MLPs (``mlp``; the batch rule gives each part its own factor), then one group per
        enabled per-view component (its own learning rate and L2). The layout is the same under every
        rule and world size, so that a checkpoint resumes on any number of GPUs."""
        views = [c.parameter_group(total_steps).as_dict() for c in self.view_components]
        own = {id(p) for g in views for p in g["params"]}
        mlps = {id(p) for p in self.field.mlp_parameters()}
        table = [p for p in self.parameters() if id(p) not in own and id(p) not in mlps]
        mlp = [p for p in self.parameters() if id(p) in mlps]
        field = [
            {"params": table, "name": "table", "lr_part": "table"},
            {"params": mlp, "name": "mlp", "lr_part": "mlp"},
        ]
        return [*(g for g in field if g["params"]), *views]

    def _rule_decay(self) -> dict[str, float]:
        """The batch rule's learning-rate decay (``TrainingClock.decay``) as the scheduler's keywords; none
        when the rule keeps the configured one. A scheduler without ``decay_start`` / ``decay_interval``
        keeps its own schedule, with a warning."""
        decay = self.clock.decay
        if decay is None:
            return {}
        factory = self.scheduler_factory
        accepts = inspect.signature(getattr(factory, "func", factory)).parameters
        if not {"decay_start", "decay_interval"} <= set(accepts):
            log.warning(
                "batch_rule=%s moves the learning-rate decay to %g of the run (every %g), but "
                "model.scheduler has no decay_start / decay_interval: it keeps its own schedule",
                self.clock.rule.name, *decay,
            )  # fmt: skip
            return {}
        log.info(
            "batch_rule=%s: the learning-rate decay from %g of the run, every %g",
            self.clock.rule.name, *decay,
        )  # fmt: skip
        return {"decay_start": decay[0], "decay_interval": decay[1]}

    def configure_optimizers(self) -> dict[str, Any]:
        clock = self.clock
        # in reference steps: the length this clock's positions run to
        total = clock.total if clock.bound else None
        if total is None:
            trainer = self._trainer
            max_steps = trainer.max_steps if trainer is not None else None
            total = max_steps if max_steps and max_steps > 0 else 10_000
        groups = self.parameter_groups(total)
        optimizer = self.optimizer_factory(params=groups)
        # the per-view groups come last; those with a schedule of their own replace the main factor
        first = len(groups) - len(self.view_components)
        factors = [c.parameter_group(total).lr_lambda for c in self.view_components]
        own = {first + i: f for i, f in enumerate(factors) if f is not None}
        scheduler = None
        if self.scheduler_factory is not None:
            scheduler = self.scheduler_factory(optimizer=optimizer, total_steps=total, **self._rule_decay())
        if own:
            base = scheduler if scheduler is not None else torch.optim.lr_scheduler.LambdaLR(optimizer, _one)
            scheduler = with_group_lambdas(base, own)
        if not clock.trivial:
            scheduler = on_clock(optimizer, clock, scheduler)
        if scheduler is None:
            return {"optimizer": optimizer}
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["training_clock"] = self.clock.state_dict(self.global_step)
        # The budgeted step's adapted ray count is state of the run (the step is not a registered
        # submodule, so the state dict does not hold it): a resumed run continues with it.
        if self.train_step_fn is not None:
            checkpoint["train_step"] = {k: v.detach().cpu().clone() for k, v in self._step_buffers().items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "training_clock" in checkpoint:
            self.clock.load_state_dict(checkpoint["training_clock"])
        saved = checkpoint.get("train_step")
        if saved and self.train_step_fn is not None:
            with torch.no_grad():
                for name, buffer in self._step_buffers().items():
                    if name in saved:
                        buffer.copy_(saved[name].to(buffer.device))


def _one(step: int) -> float:
    return 1.0


def _if_enabled(factory: Callable[..., nn.Module] | None, **kwargs: Any) -> Any:
    """The component ``factory(**kwargs)`` builds when it is enabled, else None."""
    if factory is None:
        return None
    component = factory(**kwargs)
    return component if component.enabled else None


def _all_reduce_max(tensor: Tensor) -> None:
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)


def _resolve_alpha_weight(alpha_weight: float | str, photograph: bool) -> float:
    """``model.alpha_weight``: a weight >= 0, or ``auto`` (:data:`RENDER_ALPHA_WEIGHT` for renders, 0 for
    photographs)."""
    if alpha_weight == "auto":
        return 0.0 if photograph else RENDER_ALPHA_WEIGHT
    if isinstance(alpha_weight, bool) or not isinstance(alpha_weight, int | float) or alpha_weight < 0:
        raise ValueError(f"model.alpha_weight must be a number >= 0 or auto, got {alpha_weight!r}")
    return float(alpha_weight)


def _batch_alpha(batch: dict[str, Any]) -> Tensor:
    """The training batch's ``alpha`` [R], which ``model.alpha_weight`` needs."""
    if "alpha" not in batch:
        raise ValueError(
            "model.alpha_weight > 0 needs the batch's alpha: images that carry alpha, drawn with "
            "NeRFDataModule.alpha_targets on (the train app sets it)"
        )
    return batch["alpha"]
