"""The LightningModule: rays -> packed samples -> field -> compositing -> loss, and validation renders."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Formerly, Injected, KeysOf, Note, Range
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.lightning_compat import (
    FastHookNames,
    align_step_counts,
    count_optimizer_step,
    logs_this_step,
    set_max_steps,
    throttle_sigterm_broadcast,
)
from nerf_lightning.models import optimization
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer
from nerf_lightning.models.evaluation import render_view, save_panel
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.heldout_fit import HeldoutFit, HeldoutScores
from nerf_lightning.models.metrics import METRICS, ViewMetrics
from nerf_lightning.models.nerf import NeRF
from nerf_lightning.models.train_step import StepStats, TrainStep, autocast_for, capture
from nerf_lightning.models.update_graph import GraphedUpdate, capture_update, plain_groups
from nerf_lightning.run.strategies import fsdp_full_copy, full_parameters
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.volume.occupancy import OccupancyGrid, all_reduce_max

log = logging.getLogger(__name__)


@dataclass
class Unowned:
    """Modules a :class:`NeRFModule` calls but does not own. Held by this plain object, they stay out of
    ``nn.Module``'s registry: the field and renderer they share appear once in the state dict and the
    parameter list, and the evaluation copy not at all."""

    #: the training step (``TrainStep``: it shares the field and the renderer), or its CUDA-graphed replay
    step: Any
    #: builds a field of the same shape: under FSDP, evaluation renders with a plain full copy
    new_field: Callable[[], NGPField]
    #: that copy while an evaluation epoch runs under FSDP (None: the field itself)
    eval_field: nn.Module | None = None
    #: the step's forward, backward and optimizer update as one CUDA graph (``graph_optimizer``)
    update: GraphedUpdate | None = None


class NeRFModule(FastHookNames, L.LightningModule):
    """instant-ngp NeRF training as a LightningModule: it runs the :class:`~nerf_lightning.models.nerf.NeRF`
    that Hydra builds (``model.net``), captures its step as CUDA graphs, logs, keeps the training clock
    and the checkpoint's run state.

    Args:
        net: the field, renderer, per-view parts, training step and loss (``models/nerf.py``'s
            ``build_nerf``, the ``model.net`` node, called by the train app with the capture's values:
            ``run/model_node.py``). Its parts are this module's ``field``, ``renderer``, ``camera_opt``
            and ``appearance`` (the state dict's names).
        optimizer: factory of the optimizer, called with parameter groups.
        scheduler: factory called with ``(optimizer, total_steps)``; stepped every optimizer step.
        cuda_graph: ``auto`` (capture the budgeted step as CUDA graphs on a GPU, except under FSDP,
            whose parameters are re-gathered every step), ``true`` or ``false``. The one switch of
            CUDA graphs: the train app hands it to the DataModule too (its graphed batch draw).
        graph_optimizer: the optimizer's update in the step's CUDA graph (``models/update_graph.py``: one
            replay runs the forward, the backward and the update), under Lightning's manual
            optimization. ``auto``: wherever the step is graphed on one device without gradient
            accumulation, gradient clipping or fp16 loss scaling (``16-mixed``); ``false``: Lightning's
            automatic optimization, the update eager; ``true``: manual optimization everywhere (the
            update eager where nothing is graphed: the CPU's form of the same loop).
        sigterm_check_every: under DDP/FSDP, run Lightning's cross-rank SIGTERM check (a host sync)
            every N optimizer steps instead of every step.
        val_chunk: rays per chunk when rendering validation images; save_val_images: write
            ``val/view{v}_step{s}.png`` (GT | prediction | depth | error).
        lpips: LPIPS in the evaluation metrics: ``null`` (VGG, as nerfacc, when its weights are local),
            ``false``, or a torchmetrics net name (``vgg``, ``alex``, ``squeeze``).
        heldout_fit: the fair held-out protocol's switch and budget (``models/heldout_fit.py``), in the
            evaluation passes outside ``fit`` (the final evaluation, ``eval``). None: its defaults.
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback`, shared with the
            DataModule: the training clock of ``batch_rule``, the ray sampler that gets each step's
            per-ray losses, and the training cameras (the occupancy grid marks their unseen cells).
            None: one process's clock of optimizer steps, attached to nothing.

    Evaluation (``validation_step`` / ``test_step``, one whole held-out image per batch): PSNR, SSIM
    (and LPIPS) per image, logged at the end of the pass as their means over the views
    (``val/psnr`` ... and ``test/psnr`` ...; see ``models/metrics.py``). The full result of the last
    pass of each stage, per-view numbers included, is kept in :attr:`eval_results`.
    """

    def __init__(
        self,
        net: NeRF,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        cuda_graph: Annotated[
            bool | Literal["auto"], Note("auto: on a GPU, not under FSDP"), Formerly("data.cuda_graph")
        ] = "auto",
        graph_optimizer: Annotated[
            bool | Literal["auto"], Note("auto: one device, no accumulation, clipping or 16-mixed")
        ] = False,
        sigterm_check_every: Annotated[int, Range(low=1)] = 100,
        val_chunk: Annotated[int, Range(low=1)] = 32768,
        save_val_images: bool = True,
        lpips: bool | str | None = None,
        heldout_fit: Annotated[HeldoutFit | dict[str, Any] | None, KeysOf(HeldoutFit)] = None,
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
    ) -> None:
        super().__init__()
        check_arguments(NeRFModule, locals())
        # Factories are not saved: checkpoints must load with torch.load(weights_only=True), Lightning's
        # default when resuming (`ckpt_path=`); the run's .hydra/config.yaml records them.
        unsaved = ["net", "optimizer", "scheduler", "feedback", "heldout_fit"]
        self.save_hyperparameters(logger=False, ignore=unsaved)
        self.field = net.field
        self.renderer = net.renderer
        #: the step's loss (``model.net.loss``, ``alpha_weight`` resolved)
        self.step_loss = net.loss
        # Learned per-training-view state: submodules (state dict, parameters, DDP) only when enabled.
        self.camera_opt: CameraOptimizer | None = net.camera_opt
        self.appearance: PerViewExposure | None = net.appearance
        #: the training step (after capture, its CUDA graphs' replay) and the FSDP evaluation copy
        self.unowned = Unowned(net.step, net.new_field)
        self._graphed = False
        self._update_capture_failed = False  # graph_optimizer=auto fell back to the eager update
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.feedback = feedback if feedback is not None else TrainingFeedback()
        self.feedback.alpha_targets = self.alpha_weight > 0  # the batches carry the opacity loss's target
        self.clock = self.feedback.clock
        self.metrics = nn.ModuleDict({"val": ViewMetrics(lpips=lpips), "test": ViewMetrics(lpips=lpips)})
        #: stage ("val" / "test") -> last ViewMetrics.compute() result of that stage (rank 0 has all views)
        self.eval_results: dict[str, dict[str, Any]] = {}
        #: the fair held-out protocol's budget, switch and scores (``<stage>/psnr_fitted`` ...)
        self.fair_heldout = HeldoutScores(heldout_fit, lpips)
        # Device-side counters read by the throughput callback (no host sync in the step).
        self.register_buffer("rays_seen", torch.zeros((), dtype=torch.float64), persistent=False)
        self.register_buffer("samples_seen", torch.zeros((), dtype=torch.float64), persistent=False)

    @property
    def alpha_weight(self) -> float:
        """The opacity loss's weight, ``model.net.loss.alpha_weight`` resolved (0: off, the batches carry
        no alpha)."""
        return float(self.step_loss.alpha_weight)

    @property
    def train_step_fn(self) -> TrainStep:
        """The training step (:attr:`unowned`), a :class:`TrainStep` or its CUDA-graphed replay."""
        return self.unowned.step

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
        self.train_step_fn.to(self.device)  # its own buffers (n_active); not a registered child
        if not self._graphed:  # the capacities are baked into a captured graph
            self.train_step_fn.follow_clock(self.clock)
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

    def on_train_start(self) -> None:
        # after the checkpoint's loops are restored: a run resumed under the other kind of optimization
        # (graph_optimizer, or another number of devices) continues the saved step count
        align_step_counts(self.trainer)

    def _follow_clock_length(self) -> None:
        """When the schedules count rays, ``trainer.max_steps`` counts reference steps: the run ends after
        the optimizer steps that see as many rays (``TrainingClock.optimizer_steps``)."""
        steps = self.clock.optimizer_steps()
        if steps is None or steps == self.trainer.max_steps:
            return
        set_max_steps(self.trainer, steps)
        if self.trainer.is_global_zero:
            clock = self.clock
            msg = "batch_rule=%s: %d optimizer steps of %.4g reference batches (trainer.max_steps=%d)"
            log.info(msg, clock.rule.name, steps, clock.k, clock.total)

    def set_work_scale(self, scale: float) -> None:
        """This rank's share of the work (mean 1 over the ranks) under ``batch_rule=throughput``:
        the fraction of the sample budget its ray count aims at, or its rays per step."""
        if not self.train_step_fn.set_work_share(scale):
            self.feedback.work_scale = float(scale)

    def training_step(self, batch: RayBatch, batch_idx: int) -> Tensor:
        outputs = self._forward(batch) if self.automatic_optimization else self._update(batch)
        loss, per_ray, valid, stats_tensor = outputs
        # The graphed step returns every float output as requiring grad. Summed into the run's
        # counters as they are, each step's autograd graph would stay alive from step to step.
        per_ray, stats = per_ray.detach(), StepStats.of(stats_tensor.detach())
        self.feedback.report_losses(batch.view_ids, batch.px, batch.py, per_ray, valid=valid)
        self.rays_seen += stats.rays
        self.samples_seen += stats.marched_samples
        if logs_this_step(self._trainer):
            self.log("train/loss", loss.detach())
            self.log("train/psnr", -10.0 * torch.log10(stats.mse.clamp_min(1e-10)).float())
            self.log("train/rays_per_step", stats.rays.float())
        return loss

    def _forward(self, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The step's forward (its backward and the update are Lightning's: automatic optimization),
        captured as CUDA graphs on its first call where :meth:`_use_cuda_graph`."""
        step = self.train_step_fn
        if not self._graphed and self._use_cuda_graph():
            # share_inputs: the batch graph's output buffers become the step graph's inputs (no
            # copies per step); an eager batch is copied into the first batch's tensors, unused by then
            precision, alias = self.trainer.precision, self._alias_gradients()
            step = capture(step, batch, precision, alias_gradients=alias, share_inputs=True)
            self.unowned.step = step
            self._graphed = True
        with autocast_for(self.trainer.precision) if self._graphed else nullcontext():
            return step(batch)

    def _update(self, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One optimizer step under manual optimization (``graph_optimizer``): after one eager update (the
        optimizer's state), forward, backward and update are one CUDA graph's replay where the step is
        graphed (:meth:`_graphs_update`); eager otherwise. Then the learning-rate schedule's step."""
        optimizer = self.optimizers()
        assert isinstance(optimizer, LightningOptimizer)  # one optimizer: configure_optimizers
        update = self.unowned.update
        if update is None and optimizer.optimizer.state and self._graphs_update():
            update = self._capture_update(optimizer.optimizer, batch)
        if update is not None:
            outputs = update(batch)
            count_optimizer_step(optimizer)
        else:
            outputs = self.train_step_fn(batch)
            self.manual_backward(outputs[0])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()  # type: ignore[union-attr]
        return outputs

    def _capture_update(self, optimizer: torch.optim.Optimizer, batch: RayBatch) -> GraphedUpdate | None:
        """The step and ``optimizer``'s update captured as one graph (``models/update_graph.py``), the
        replay of every later step; under ``graph_optimizer=auto`` an optimizer that can't be captured
        keeps the eager update, with a warning."""
        precision = self.trainer.precision
        try:
            update = capture_update(self.train_step_fn, optimizer, batch, precision, share_inputs=True)
        except ValueError as err:
            if self.hparams.graph_optimizer is True:
                raise
            log.warning("model.graph_optimizer=auto: the update stays eager (%s)", err)
            self._update_capture_failed = True
            return None
        self.unowned.update = update
        self._graphed = True
        return update

    @property
    def automatic_optimization(self) -> bool:  # type: ignore[override]
        """Lightning's automatic optimization, unless the update is this module's (``graph_optimizer``):
        decided once per trainer, before ``fit`` checks the loop's configuration."""
        trainer = self._trainer
        cached = self.__dict__.get("_manual_for")  # (id of the trainer, manual): no reference to it kept
        if cached is None or cached[0] != id(trainer):
            cached = self.__dict__["_manual_for"] = (id(trainer), self._updates_manually(trainer))
        return not cached[1]

    def _updates_manually(self, trainer: L.Trainer | None) -> bool:
        mode = self.hparams.graph_optimizer
        if mode is False or trainer is None:
            return False
        return mode is True or self._graphs_update(trainer)

    def _graphs_update(self, trainer: L.Trainer | None = None) -> bool:
        """Whether the update joins the step's CUDA graph: the step graphed, on one device, without
        gradient accumulation, gradient clipping (both Lightning's, which manual optimization leaves
        out) or the fp16 loss scale (its skipped steps and scale are decided on the host)."""
        trainer = trainer if trainer is not None else self.trainer
        if self._update_capture_failed:
            return False
        return (
            self._use_cuda_graph(trainer)
            and trainer.world_size == 1
            and trainer.accumulate_grad_batches == 1
            and trainer.gradient_clip_val is None
            and str(trainer.precision) != "16-mixed"
        )

    def _use_cuda_graph(self, trainer: L.Trainer | None = None) -> bool:
        """Whether the step runs as CUDA graphs: ``cuda_graph`` not false, the budgeted step on a GPU, not
        under FSDP (``trainer``: this module's)."""
        trainer = trainer if trainer is not None else self.trainer
        mode = self.hparams.cuda_graph
        if mode is False or trainer.strategy.root_device.type != "cuda" or not self.train_step_fn.budgeted:
            return False
        from lightning.pytorch.strategies import FSDPStrategy

        return not isinstance(trainer.strategy, FSDPStrategy)

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
            with full_parameters(self.trainer):
                self.occupancy.update(self.global_step, self.field.density, share=(self.global_rank, world))
            if world > 1:
                self.occupancy.sync_(all_reduce_max)

    # -------------------------------------------------------------------------- evaluation
    def render_view(self, batch: dict[str, Any], stage: str | None = None) -> dict[str, Tensor]:
        """One held-out view batch rendered (``models/evaluation.py``'s ``render_view``), with the
        field's full copy under FSDP; scored into ``stage``'s metrics when given (and the fair
        protocol's, when this pass runs it)."""
        field = self.unowned.eval_field if self.unowned.eval_field is not None else self.field
        chunk = self.hparams.val_chunk
        view = render_view(self.renderer, field, batch, chunk, self.camera_opt, self.appearance)
        if stage is not None:
            self.metrics[stage].update(
                view["rgb"], view["gt"], batch["view"], ngp=view.get("ngp"), black=view.get("black"),
                keep=view.get("keep"),
            )  # fmt: skip
            trainer = self._trainer
            if trainer is None or trainer.state.fn != TrainerFn.FITTING:  # never while training
                corrections = bool(self.view_components)
                self.fair_heldout.update(stage, self.renderer, field, batch, chunk, corrections)
        return view

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        view = self.render_view(batch, "val")
        if self.hparams.save_val_images and batch_idx == 0 and self.trainer.is_global_zero:
            run_dir = Path(self.trainer.default_root_dir)
            save_panel(
                run_dir, batch["view"], self.global_step, view["gt"], view["rgb"], view["depth"], self.loggers
            )
        # for callbacks (eval writes every view): prediction [H, W, 3], depth and opacity [H, W]
        return {k: view[k] for k in ("rgb", "depth", "opacity")}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        view = self.render_view(batch, "test")
        return {k: view[k] for k in ("rgb", "depth", "opacity")}

    def on_validation_epoch_start(self) -> None:
        self._gather_eval_field()

    def on_test_epoch_start(self) -> None:
        self._gather_eval_field()

    def on_validation_epoch_end(self) -> None:
        self.unowned.eval_field = None
        self._log_eval("val")

    def on_test_epoch_end(self) -> None:
        self.unowned.eval_field = None
        self._log_eval("test")

    def _gather_eval_field(self) -> None:
        """Under FSDP, the field's full copy that this evaluation epoch renders with (every rank)."""
        copy = fsdp_full_copy(self.trainer, self.field, self.unowned.new_field)
        self.unowned.eval_field = copy

    def _log_eval(self, stage: str) -> None:
        """Log the means of one evaluation pass (already gathered over ranks), and the fair protocol's
        (``<stage>/psnr_fitted`` ...) when it ran, and keep the results in :attr:`eval_results`."""
        for suffix, metrics in (("", self.metrics[stage]), ("_fitted", self.fair_heldout.metrics[stage])):
            if not metrics.update_count:
                continue  # no evaluation batch ran (e.g. limit_val_batches=0), or no fit
            result = self.eval_results[stage + suffix] = metrics.compute()
            metrics.reset()
            for name in METRICS:
                if name in result:  # every rank holds the gathered mean, so no further reduction
                    prog_bar = name + suffix == "psnr"
                    self.log(f"{stage}/{name}{suffix}", result[name], prog_bar=prog_bar, sync_dist=False)

    @property
    def view_components(self) -> list[CameraOptimizer | PerViewExposure]:
        """The enabled per-training-view components (camera corrections, exposure), in group order."""
        return [c for c in (self.camera_opt, self.appearance) if c is not None]

    def view_summary(self) -> dict[str, float]:
        """Sizes of the learned corrections and exposures (``metrics.json``)."""
        return {k: v for c in self.view_components for k, v in c.summary().items()}

    def configure_optimizers(self) -> dict[str, Any]:
        clock = self.clock
        # in reference steps: the length this clock's positions run to
        total = clock.total if clock.bound else None
        if total is None:
            trainer = self._trainer
            max_steps = trainer.max_steps if trainer is not None else None
            total = max_steps if max_steps and max_steps > 0 else 10_000
        return optimization.configure(self, self.optimizer_factory, self.scheduler_factory, clock, total)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["training_clock"] = self.clock.state_dict(self.global_step)
        if self.unowned.update is not None and "optimizer_states" in checkpoint:
            # the graph's tensor learning rates as the eager optimizer's floats: one checkpoint format
            checkpoint["optimizer_states"] = [plain_groups(s) for s in checkpoint["optimizer_states"]]
        # The budgeted step's adapted ray count is state of the run (the step is not a registered
        # submodule, so the state dict does not hold it): a resumed run continues with it.
        buffers = self.train_step_fn.state_buffers()
        if buffers:
            checkpoint["train_step"] = {k: v.detach().cpu().clone() for k, v in buffers.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "training_clock" in checkpoint:
            self.clock.load_state_dict(checkpoint["training_clock"])
        saved = checkpoint.get("train_step")
        if saved:
            with torch.no_grad():
                for name, buffer in self.train_step_fn.state_buffers().items():
                    if name in saved:
                        buffer.copy_(saved[name].to(buffer.device))
