"""Live performance monitoring: rays/s, samples/s, step time, GPU utilization and memory.

The module accumulates ``rays_seen`` / ``samples_seen`` (float64 scalars) on the training device every
step. This callback reads them, and the GPU's counters, only every ``log_every_n_steps`` optimizer
steps (the one host sync of the window), so the hot path never waits for the device. Each reading
covers the window since the previous one:

- progress bar (rich): ``rays/s``, ``samples/s``, ``ms/step``, ``gpu%``;
- loggers: ``perf/rays_per_s``, ``perf/samples_per_s``, ``perf/samples_per_ray``, ``perf/step_time_ms``,
  ``gpu/utilization`` (NVML, %), ``gpu/mem_peak_gb`` (PyTorch allocator peak), ``gpu/mem_used_gb``
  (NVML, whole device); under DDP the per-rank values are gathered to rank 0 (``perf/rank{r}/...``)
  and the totals are sums over ranks;
- ``summary()`` (what ``train.py`` writes into ``metrics.json``): whole-run averages of the training
  loop (validation excluded), summed over ranks. ``time/train_s`` is the training time of every
  process that trained the run (each checkpoint stores the time up to it, a resumed run adds its own),
  ``time/train_s_this_process`` this process's part; the rates and ``perf/step_time_ms`` are this
  process's (absent when it trained no step).
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import lightning as L
import torch

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.utils.units import si_number

log = logging.getLogger(__name__)

# Per-rank window record, gathered across ranks: [rays, samples, seconds, steps, util %, peak GB, used GB].
_K = 7


class _GpuCounters:
    """NVML utilization and memory of one CUDA device; every reading is optional (-1 when unavailable)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._handle: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            try:  # NVML counts physical devices: map through CUDA_VISIBLE_DEVICES as torch.cuda does
                index = torch.cuda._get_nvml_device_index(index)
            except Exception:  # noqa: BLE001
                pass
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as err:  # noqa: BLE001 - no NVML: fall back to torch.cuda.utilization or nothing
            log.debug("NVML unavailable (%s); GPU utilization from torch.cuda if possible", err)
            self._handle = None

    def read(self) -> tuple[float, float, float]:
        """``(utilization %, allocator peak GB since the last read, device memory used GB)``; -1 = unknown."""
        if self.device.type != "cuda":
            return -1.0, -1.0, -1.0
        util, used = -1.0, -1.0
        if self._handle is not None:
            try:
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
                used = float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used) / 2**30
            except Exception:  # noqa: BLE001
                pass
        else:
            try:
                util = float(torch.cuda.utilization(self.device))
            except Exception:  # noqa: BLE001
                pass
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        torch.cuda.reset_peak_memory_stats(self.device)
        return util, peak, used


class ThroughputMonitor(L.Callback):
    """Throughput and GPU monitor (see the module docstring).

    Args:
        log_every_n_steps: optimizer steps between readings (None: ``trainer.log_every_n_steps``).
        prog_bar: show the latest window in the progress bar.
        per_rank: under DDP, also log every rank's samples/s, step time and GPU utilization.
    """

    def __init__(
        self,
        log_every_n_steps: Annotated[int | None, Range(low=1), Note("null: trainer.log_every_n_steps")] = (
            None
        ),
        prog_bar: bool = True,
        per_rank: bool = True,
    ) -> None:
        check_arguments(ThroughputMonitor, locals())
        self.log_every_n_steps = log_every_n_steps
        self.prog_bar = prog_bar
        self.per_rank = per_rank
        # whole-run totals of the training loop on this rank (validation excluded)
        self._train_s = 0.0
        self._t0: float | None = None
        self._rays = 0.0
        self._samples = 0.0
        self._steps = 0
        self._steps_at_start = 0
        #: training seconds before this process (restored from the checkpoint a resumed run starts from)
        self._train_s_before = 0.0
        # aggregated over ranks by on_train_end
        self._total: dict[str, float] | None = None
        # current window: (time, rays, samples, global_step) at its start; None = start at next reading
        self._window: tuple[float, float, float, int] | None = None
        self._util: list[float] = []
        self._mem_peak = 0.0
        self._gpu: _GpuCounters | None = None
        self._pbar: dict[str, float | str] = {}
        #: the latest reading, for other consumers (the Prometheus exporter): its optimizer step (-1: none
        #: yet), this rank's own window (``rays``, ``samples``, ``seconds``, ``steps``, ``gpu_util``,
        #: ``mem_peak_gb``, ``mem_used_gb``; -1 = unknown; ``rays_seen``/``samples_seen`` since the
        #: start) and the logged metrics over all ranks (``perf/rays_per_s``, ...).
        self.latest_step = -1
        self.latest_local: dict[str, float] = {}
        self.latest: dict[str, float] = {}

    # ------------------------------------------------------------------------------ helpers
    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _every(self, trainer: L.Trainer) -> int:
        return max(1, int(self.log_every_n_steps or trainer.log_every_n_steps or 50))

    @staticmethod
    def _counters(pl_module: L.LightningModule) -> tuple[float, float]:
        # The host reads of the run: only at window boundaries.
        return float(pl_module.rays_seen), float(pl_module.samples_seen)

    def _open_window(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        rays, samples = self._counters(pl_module)
        self._window = (time.perf_counter(), rays, samples, trainer.global_step)
        if self._gpu is not None:
            self._gpu.read()  # resets the allocator peak so that windows do not overlap

    # --------------------------------------------------------------------------- the clock
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._gpu = _GpuCounters(trainer.strategy.root_device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not in on_fit_start: a resumed run restores its global step only after that hook.
        self._steps = self._steps_at_start = trainer.global_step

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        self._t0 = time.perf_counter()
        self._open_window(trainer, pl_module)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        # A run resumed mid-epoch (SLURM requeue, a crash) gets no on_train_epoch_start: start here.
        if self._t0 is None:
            self.on_train_epoch_start(trainer, pl_module)

    def _stop_clock(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._t0 is None:
            return
        self._sync(trainer)
        self._train_s += time.perf_counter() - self._t0
        self._t0 = None
        self._window = None  # a window never spans validation
        self._rays, self._samples = self._counters(pl_module)
        self._steps = trainer.global_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._stop_clock(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.training:
            self._sync(trainer)
            self._t0 = time.perf_counter()
            self._open_window(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_clock(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_clock(trainer, pl_module)
        local = torch.tensor([self._rays, self._samples, self._train_s], dtype=torch.float64,
                             device=pl_module.device)
        per_rank = self._gather(trainer, local)  # [W, 3]; a collective: every rank calls it
        t = per_rank[:, 2].clamp_min(1e-9)
        self._total = {
            "rays": float(per_rank[:, 0].sum()),
            "samples": float(per_rank[:, 1].sum()),
            "rays_per_s": float((per_rank[:, 0] / t).sum()),
            "samples_per_s": float((per_rank[:, 1] / t).sum()),
            "train_s": float(per_rank[:, 2].max()),
            "world_size": float(per_rank.shape[0]),
        }

    @staticmethod
    def _gather(trainer: L.Trainer, local: torch.Tensor) -> torch.Tensor:
        """``[W, K]`` from every rank's ``[K]`` (``[1, K]`` on one process)."""
        if trainer.world_size <= 1:
            return local[None]
        gathered = trainer.strategy.all_gather(local)
        return gathered.reshape(trainer.world_size, -1)

    # ------------------------------------------------------------------- checkpoint state
    def state_dict(self) -> dict[str, float]:
        """Into every checkpoint: the training seconds that led to its weights (earlier processes' and
        this one's so far; the clock is read without a device sync, a checkpoint is no hot path)."""
        running = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return {"train_s": self._train_s_before + self._train_s + running}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._train_s_before = float(state_dict.get("train_s", 0.0))

    # ---------------------------------------------------------------------------- readings
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == 0 or step % self._every(trainer) != 0 or self._t0 is None or self._window is None:
            return
        if self._window[3] == step:  # same optimizer step (gradient accumulation): nothing new yet
            return
        self._sync(trainer)
        now = time.perf_counter()
        rays, samples = self._counters(pl_module)
        t0, rays0, samples0, step0 = self._window
        util, peak, used = self._gpu.read() if self._gpu is not None else (-1.0, -1.0, -1.0)
        local = torch.tensor([rays - rays0, samples - samples0, now - t0, step - step0, util, peak, used],
                             dtype=torch.float64, device=pl_module.device)
        self._window = (now, rays, samples, step)
        record = self._gather(trainer, local).cpu()  # [W, _K]
        metrics = self._window_metrics(record)
        self.latest_step, self.latest = step, metrics
        self.latest_local = {
            "rays": rays - rays0, "samples": samples - samples0, "seconds": now - t0,
            "steps": float(step - step0), "gpu_util": util, "mem_peak_gb": peak, "mem_used_gb": used,
            "rays_seen": rays, "samples_seen": samples,
        }
        if metrics.get("gpu/utilization", -1.0) >= 0:
            self._util.append(metrics["gpu/utilization"])
        self._mem_peak = max(self._mem_peak, metrics.get("gpu/mem_peak_gb", 0.0))
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                lg.log_metrics(metrics, step=step)
        # rates with a unit that fits (a CPU's 576 rays/s, a GPU's 12.3 M): the viewer's panel says the same
        self._pbar = {"rays/s": si_number(metrics["perf/rays_per_s"]),
                      "samples/s": si_number(metrics["perf/samples_per_s"]),
                      "ms/step": metrics["perf/step_time_ms"]}
        if "gpu/utilization" in metrics:
            self._pbar["gpu%"] = metrics["gpu/utilization"]

    def progress_bar_metrics(self) -> dict[str, float | str]:
        """The latest reading as plain values for ``callbacks.progress.ProgressBar``: the rates as text
        with their unit (:func:`~nerf_lightning.utils.units.si_number`), the rest as floats.

        Not logged through ``LightningModule.log(prog_bar=True)``: Lightning stores logged values as
        device tensors and reads them back at every refresh of the bar, a host sync each time."""
        return dict(self._pbar) if self.prog_bar else {}

    def _window_metrics(self, record: torch.Tensor) -> dict[str, float]:
        """Metrics of one window from the gathered per-rank record ``[W, _K]`` (float64, host)."""
        rays, samples, dt, steps = record[:, 0], record[:, 1], record[:, 2].clamp_min(1e-9), record[:, 3]
        steps = steps.clamp_min(1.0)
        rays_ps, samples_ps = rays / dt, samples / dt
        step_ms = dt / steps * 1e3
        m = {
            "perf/rays_per_s": float(rays_ps.sum()),
            "perf/samples_per_s": float(samples_ps.sum()),
            "perf/samples_per_ray": float(samples.sum() / rays.sum().clamp_min(1.0)),
            "perf/step_time_ms": float(step_ms.max()),  # the slowest rank sets the pace
        }
        util, peak, used = record[:, 4], record[:, 5], record[:, 6]
        if bool((util >= 0).all()):
            m["gpu/utilization"] = float(util.mean())
        if bool((peak >= 0).all()):
            m["gpu/mem_peak_gb"] = float(peak.max())
        if bool((used >= 0).all()):
            m["gpu/mem_used_gb"] = float(used.max())
        if self.per_rank and record.shape[0] > 1:
            for r in range(record.shape[0]):
                m[f"perf/rank{r}/samples_per_s"] = float(samples_ps[r])
                m[f"perf/rank{r}/step_time_ms"] = float(step_ms[r])
                if util[r] >= 0:
                    m[f"gpu/rank{r}/utilization"] = float(util[r])
        return m

    # ----------------------------------------------------------------------------- summary
    def summary(self) -> dict[str, float]:
        """Whole-run training-loop averages for ``metrics.json`` (summed over ranks under DDP)."""
        t = max(self._train_s, 1e-9)
        total = self._total or {
            "rays": self._rays, "samples": self._samples, "rays_per_s": self._rays / t,
            "samples_per_s": self._samples / t, "train_s": self._train_s, "world_size": 1.0,
        }
        steps_run = max(self._steps - self._steps_at_start, 0)
        out = {
            "time/train_s": self._train_s_before + total["train_s"],  # across resumes
            "time/train_s_this_process": total["train_s"],
            "steps": self._steps,
        }
        if steps_run > 0:  # rates of this process: none when it trained no step (a resumed finished run)
            out["train/rays_per_s"] = total["rays_per_s"]
            out["train/samples_per_s"] = total["samples_per_s"]
            out["train/samples_per_ray"] = total["samples"] / max(total["rays"], 1.0)
            out["perf/step_time_ms"] = total["train_s"] / steps_run * 1e3
        if self._util:
            out["gpu/utilization_mean"] = sum(self._util) / len(self._util)
        if self._mem_peak > 0:
            out["gpu/mem_peak_gb"] = self._mem_peak
        return out
