"""The viewer while training (``python -m nerf_lightning.train viewer=on``): a Lightning callback.

The server starts on rank 0 when fitting starts (the port is checked at ``setup``, before the data is
loaded) and renders only between two optimizer steps, in ``on_train_batch_end`` (never inside the
training step, which may be a captured CUDA graph), in bursts within a time budget
(``viewer/budget.py``): at most one burst every ``burst_every_s``, each after one device synchronize,
so that the GPU's queue of training work is drained once per burst instead of once per step; each
second of training earns ``budget`` seconds of render time, and the burst's render time and the step
after it (the refill of the drained queue) are charged, so the viewer costs at most
``budget / (1 + budget)`` of the run (7.4 % at 0.08) while a browser has something to see. Between
bursts a step costs one clock read; with no browser connected there is no burst at all (no
synchronize). The statistics (step, loss, held-out PSNR, rays/s) are read from the device once per
``stats_every_s``, inside a burst (after its synchronize) and only while a browser is connected.

Pause holds the training loop in the callback: it waits on an event (no busy loop, the GIL is free)
and renders for the browsers meanwhile; "Stop training" ends the fit after the current step (the
run then validates and writes its checkpoint and metrics as at its last step). Both buttons are
looked at every ``burst_every_s``. Under several processes (DDP) rank 0 shows the scene and
statistics without pause and stop (one rank cannot hold the others); FSDP shards the field, so the
viewer is refused there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import lightning as L
import torch

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Note, Range
from nerf_lightning.errors import UserError
from nerf_lightning.lightning_compat import validates_by_time
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.viewer.access import check_token
from nerf_lightning.viewer.budget import BurstBudget
from nerf_lightning.viewer.options import MaxSize, Port, PreviewSize
from nerf_lightning.viewer.ports import check_port
from nerf_lightning.viewer.status import TrainingStatus

__all__ = ["ViewerCallback", "next_validation_step"]

log = logging.getLogger(__name__)


class ViewerCallback(L.Callback):
    """The live viewer of a training run (see the module docstring).

    Args:
        host, port: where the viewer listens (``127.0.0.1``: this machine only; tunnel the port over SSH).
        token: the token browsers must bring (None: one generated per launch beyond the loopback, none
            on it; ``viewer/access.py``); printed in the URL.
        budget: render seconds earned per second of training (0.08: at most 7.4 % of the run's time).
        burst_every_s: least time between two bursts of rendering (each drains the GPU's queue once).
        max_bank_s: most render seconds banked while nothing was rendered (the longest burst).
        max_size, preview_size: longest side of a full frame / of the preview (None: 1024 / 256 on a GPU,
            256 / 64 on the CPU).
        chunk_s: target seconds of one chunk of rays (None: 10 ms on a GPU, 100 ms on the CPU).
        refresh_every_s: a finished view is rendered again after this long when the weights changed.
        stats_every_s: seconds between two readings of the training statistics.
        export_dir: where camera paths are written (the run folder).
        clock: seconds, monotonic (tests pass a simulated one).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback` (the train
            app passes it), which holds the capture the viewer shows.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: Port = 7007,
        token: str | None = None,
        budget: Annotated[float, Range(above=0), Note("render seconds per training second")] = 0.08,
        burst_every_s: Annotated[float, Range(above=0), Note("seconds between two render bursts")] = 0.1,
        max_bank_s: Annotated[float, Range(above=0), Note("most render seconds banked")] = 0.1,
        max_size: MaxSize = None,
        preview_size: PreviewSize = None,
        chunk_s: Annotated[
            float | None, Range(above=0), Note("null: 10 ms on a GPU, 100 ms on the CPU")
        ] = None,
        refresh_every_s: Annotated[float, Range(above=0)] = 1.0,
        stats_every_s: Annotated[float, Range(above=0)] = 1.0,
        export_dir: str | Path = ".",
        clock: Annotated[Callable[[], float], Injected("tests: a simulated clock")] = time.perf_counter,
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
    ) -> None:
        check_arguments(ViewerCallback, locals())
        self.host, self.port = str(host), int(port)
        self.token = check_token(token, "viewer.token")
        self.budget = float(budget)
        self.burst_every_s, self.max_bank_s = float(burst_every_s), float(max_bank_s)
        self.max_size, self.preview_size, self.chunk_s = max_size, preview_size, chunk_s
        self.refresh_every_s, self.stats_every_s = float(refresh_every_s), float(stats_every_s)
        self.export_dir = Path(export_dir)
        self.clock = clock
        self.feedback = feedback
        self.server: Any = None
        self._budget: BurstBudget | None = None
        self._sync: Callable[[], None] = lambda: None
        self._next_stats = 0.0
        self._window: tuple[float, float] | None = None  # (rays seen, time) at the last reading
        self._controls = True
        #: seconds spent paused (and rendering meanwhile), for the run's summary
        self.paused_s = 0.0
        self.paused_render_s = 0.0

    # ----------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero:
            return
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(trainer.strategy, FSDPStrategy):
            raise UserError("viewer=on: not with strategy=fsdp (the field is sharded); use ddp or one device")
        check_port(self.host, self.port, "viewer.")  # before the data is loaded: a taken port fails at once

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or self.server is not None:
            return
        from nerf_lightning.viewer.scene import SceneInfo
        from nerf_lightning.viewer.server import RenderSource, ViewerServer

        capture = self.feedback.capture if self.feedback is not None else None
        if capture is None:
            raise UserError("viewer=on: no capture to show (the callback needs NeRFDataModule.feedback)")
        device = pl_module.device
        gpu = device.type == "cuda"
        source = RenderSource(
            renderer=pl_module.renderer,
            field=pl_module.field,
            background=torch.tensor(capture.eval_background, dtype=torch.float32, device=device),
            device=device,
            context=trainer.precision_plugin.forward_context,
        )
        server = ViewerServer(
            SceneInfo.of(capture),
            source,
            host=self.host,
            port=self.port,
            token=self.token,
            token_key="viewer.token",
            key_prefix="viewer.",
            max_size=self.max_size or (1024 if gpu else 256),
            preview_size=self.preview_size or (256 if gpu else 64),
            chunk_s=self.chunk_s or (0.01 if gpu else 0.1),
            refresh_every_s=self.refresh_every_s,
            export_dir=self.export_dir,
            render_command=f"python -m nerf_lightning.render ckpt={self.export_dir}",
            training=True,
        )
        controls = trainer.world_size == 1
        if not controls:
            server.training.pause.visible = server.training.stop.visible = False
        print(f"viewer: {server.url}  (training; over SSH: ssh -L {server.port}:localhost:"
              f"{server.port} HOST)", flush=True)  # fmt: skip
        sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
        self.attach(server, pipelined=gpu, sync=sync, controls=controls)

    def attach(
        self, server: Any, *, pipelined: bool, sync: Callable[[], None], controls: bool = True
    ) -> None:
        """Serve ``server`` from the training loop from now on (``on_fit_start`` ends here; a test attaches
        a stand-in). ``pipelined``: the device runs ahead of the host (a GPU); ``sync`` waits for it;
        ``controls``: pause and stop act on this process's loop."""
        self.server, self._sync, self._controls = server, sync, controls
        self._budget = BurstBudget(
            self.budget, self.burst_every_s, self.max_bank_s, pipelined=pipelined, clock=self.clock
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self.server is not None:
            self.server.training.finished(self._status(trainer, pl_module, "finished"))
            self.server.close()
            self.server = None

    # ------------------------------------------------------------------------ per step
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        budget = self._budget
        if budget is None or self.server is None or not budget.step():  # between bursts: one clock read
            return
        server = self.server
        server.model_changed()
        panel = server.training
        if self._controls and panel.stop_requested:
            trainer.should_stop = True
        if self._controls and panel.paused:
            self._pause(trainer, pl_module)
            budget.restart()
            return
        if not server.n_browsers:  # nobody to show anything to: no synchronize
            budget.wait()
            return
        now = self.clock()
        stats_due = now >= self._next_stats
        if not (stats_due or server.has_work()) or not budget.affordable:
            budget.wait()
            return
        self._sync()  # the queued training steps: the one wait for the device of this burst
        budget.open()
        if stats_due:
            self._next_stats = self.clock() + self.stats_every_s
            server.show_training(
                self._status(trainer, pl_module, "stopping" if trainer.should_stop else "training")
            )
        remaining = budget.remaining_s
        if remaining > 0 and server.has_work():
            server.render(remaining)
        budget.close()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._next_stats = 0.0  # show the new held-out PSNR at the next step

    def _pause(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        server, panel = self.server, self.server.training
        start = self.clock()
        log.info("viewer: training paused at step %d", trainer.global_step)
        shown = 0.0
        # a SIGTERM ends the pause too: Lightning then stops the fit at this step (exit 143, last.ckpt)
        while panel.paused and not panel.stop_requested and not trainer.received_sigterm:
            if self.clock() - shown >= self.stats_every_s:  # the step stays where it paused
                server.show_training(self._status(trainer, pl_module, "paused"))
                shown = self.clock()
            if server.has_work():
                self.paused_render_s += server.render(0.05)
            else:
                server.wait(0.25)  # an Event wait: no busy loop, the GIL is free
        self.paused_s += self.clock() - start
        self._window = None  # the paused time is not in the next rays/s
        if panel.stop_requested:
            trainer.should_stop = True
        server.show_training(
            self._status(trainer, pl_module, "stopping" if panel.stop_requested else "training")
        )
        log.info("viewer: training resumed at step %d", trainer.global_step)

    def _status(self, trainer: L.Trainer, pl_module: L.LightningModule, state: str) -> TrainingStatus:
        """The panel's statistics (reads the device: one host sync)."""
        metrics = trainer.callback_metrics
        now = self.clock()
        rays_seen = getattr(pl_module, "rays_seen", None)
        rays_per_s = None
        if isinstance(rays_seen, torch.Tensor):
            rays = float(rays_seen)
            if self._window is not None and now > self._window[1]:
                rays_per_s = (rays - self._window[0]) / (now - self._window[1])
            self._window = (rays, now)

        def value(key: str) -> float | None:
            v = metrics.get(key)
            return None if v is None else float(v)

        val_psnr = value("val/psnr")
        return TrainingStatus(
            step=int(trainer.global_step),
            max_steps=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            loss=value("train/loss"),
            val_psnr=val_psnr,
            rays_per_s=rays_per_s,
            state=state,
            train_psnr=value("train/psnr"),
            first_val_step=next_validation_step(trainer) if val_psnr is None else None,
        )

    def summary(self) -> dict[str, float]:
        """Into the run's metrics.json: seconds of the viewer's bursts (after their synchronize), of the
        steps after them (the refills), of the pause, and the bursts."""
        b = self._budget
        return {
            "viewer/render_s": (b.burst_s if b else 0.0) + self.paused_render_s,
            "viewer/refill_s": b.charged_refill_s if b else 0.0,
            "viewer/bursts": float(b.bursts if b else 0),
            "viewer/paused_s": self.paused_s,
        }


def next_validation_step(trainer: L.Trainer) -> int | None:
    """The optimizer step at which the next held-out PSNR is computed: the fit loop's next validation
    (the end of every ``check_val_every_n_epoch``-th epoch, or every ``val_check_interval`` batches) or
    the end of training (``max_steps``: the train app validates then), whichever comes first. ``None``
    when neither is known (no ``max_steps`` and a time-based or unsized validation interval)."""
    max_steps = getattr(trainer, "max_steps", None)
    end = max_steps if max_steps and max_steps > 0 else None
    per_epoch = getattr(trainer, "num_training_batches", None)
    every_batch = getattr(trainer, "val_check_batch", None)
    every_epoch = getattr(trainer, "check_val_every_n_epoch", None)
    if per_epoch is None:  # not a fitting trainer (a stand-in): only the end is known
        return end
    sized = every_batch is not None and math.isfinite(per_epoch) and math.isfinite(every_batch)
    if not trainer.enable_validation or not sized or validates_by_time(trainer):
        return end
    per_epoch, every_batch = int(per_epoch), max(1, int(every_batch))
    accumulate = max(1, int(trainer.accumulate_grad_batches))
    done = int(trainer.global_step) * accumulate  # training batches so far
    if every_epoch is None:  # every val_check_interval batches, counted over the whole run
        at = (done // every_batch + 1) * every_batch
    else:  # after batches every_batch, 2 every_batch, ... <= per_epoch of every every_epoch-th epoch
        epoch = done // per_epoch
        epoch += (every_epoch - (epoch + 1) % every_epoch) % every_epoch  # the next validating epoch
        start = epoch * per_epoch
        batch = (max(done - start, 0) // every_batch + 1) * every_batch
        if batch > per_epoch:  # none left in this epoch: the first of the next validating one
            start, batch = start + every_epoch * per_epoch, every_batch
        at = start + batch
    step = -(-at // accumulate)
    return step if end is None else min(step, end)
