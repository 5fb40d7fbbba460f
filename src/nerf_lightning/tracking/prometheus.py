"""Prometheus ``/metrics`` endpoint of a training run (``callbacks.prometheus.port=9400``).

Every rank serves its own endpoint on ``port + local_rank`` (rank 0 of a node on ``port``), so one
scrape target per GPU; each series carries a ``rank`` label. Nothing is measured here: the numbers
are those of :class:`~nerf_lightning.callbacks.throughput.ThroughputMonitor`'s latest window
(read when it takes one, so the exporter adds no host sync to the training step), the step, and the
training loss / PSNR this rank logged, read at the same moments:

===================================== ======= ====================================================
series                                type    value (this rank unless noted)
===================================== ======= ====================================================
``nerf_global_step``                  gauge   optimizer step (updated every step)
``nerf_rays_per_second``              gauge   rays/s over the latest window
``nerf_samples_per_second``           gauge   ray-marching samples/s over the latest window
``nerf_samples_per_ray``              gauge   samples per ray over the latest window
``nerf_step_time_seconds``            gauge   mean optimizer-step time over the latest window
``nerf_rays_total``                   counter rays trained on (use ``rate()``)
``nerf_samples_total``                counter samples evaluated
``nerf_train_loss``                   gauge   training loss at the latest window's step
``nerf_train_psnr_db``                gauge   training-batch PSNR (dB) at that step
``nerf_gpu_utilization_percent``      gauge   NVML utilization of this rank's GPU (absent on CPU)
``nerf_gpu_memory_used_bytes``        gauge   device memory in use (NVML, whole device)
``nerf_gpu_memory_peak_bytes``        gauge   PyTorch allocator peak over the latest window
``nerf_world_size``                   gauge   number of ranks
``nerf_job_rays_per_second``          gauge   rank 0 only: sum over all ranks
``nerf_job_samples_per_second``       gauge   rank 0 only: sum over all ranks
``nerf_job_step_time_seconds``        gauge   rank 0 only: the slowest rank's step time
===================================== ======= ====================================================

Windows are ``callbacks.throughput.log_every_n_steps`` optimizer steps long (default
``trainer.log_every_n_steps``). ``deploy/grafana/nerf_lightning.json`` is a dashboard of these series.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any

import lightning as L

from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Note, Range

log = logging.getLogger(__name__)

_GB = 2**30


class PrometheusExporter(L.Callback):
    """Serve this rank's training metrics for Prometheus (see the module docstring).

    Args:
        port: base TCP port; rank ``r`` of a node listens on ``port + local_rank``. ``None`` turns the
            exporter off (the default in ``conf/callbacks/default.yaml``); ``0`` picks free ports
            (``bound_port`` tells which).
        addr: interface to listen on (``0.0.0.0``: reachable by a Prometheus server on the network).
    """

    def __init__(
        self,
        port: Annotated[int | None, Range(low=0, high=65535), Note("+ the local rank; null: off")] = None,
        addr: str = "0.0.0.0",
    ) -> None:
        check_arguments(PrometheusExporter, locals())
        self.port = None if port is None else int(port)
        self.addr = addr
        #: the port this process serves on (None while not serving)
        self.bound_port: int | None = None
        self._server: Any = None
        self._thread: Any = None
        self._monitor: ThroughputMonitor | None = None
        self._seen_step = -1
        self._rays_seen = 0.0
        self._samples_seen = 0.0

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def inert(self, trainer: L.Trainer) -> bool:
        """Without a port it serves nothing (the train app then drops it: run/loop.py)."""
        return not self.enabled

    # ------------------------------------------------------------------------------ server
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.enabled or stage != "fit" or self._server is not None:
            return
        monitors = [cb for cb in trainer.callbacks if isinstance(cb, ThroughputMonitor)]
        if not monitors:
            raise ValueError(
                "callbacks.prometheus exports the numbers of callbacks.throughput (ThroughputMonitor), "
                "which is disabled: keep callbacks.throughput, or set callbacks.prometheus.port=null"
            )
        self._monitor = monitors[0]
        self._build_metrics(rank=trainer.global_rank, world_size=trainer.world_size)
        port = 0 if self.port == 0 else self.port + trainer.local_rank
        self._start(port)

    def _start(self, port: int) -> None:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(port, addr=self.addr, registry=self._registry)
        except OSError as err:
            raise OSError(
                f"callbacks.prometheus.port={self.port}: cannot serve /metrics on {self.addr}:{port} "
                f"(port + local rank): {err}. Choose a free base port or callbacks.prometheus.port=null."
            ) from err
        self.bound_port = int(self._server.server_port)
        log.info("Prometheus metrics on http://%s:%d/metrics", self.addr, self.bound_port)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.close()

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
        self._server = self._thread = None
        self.bound_port = None

    # ----------------------------------------------------------------------------- metrics
    def _build_metrics(self, rank: int, world_size: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        # A registry per run: several trainers in one process (tests, sweeps) never clash.
        self._registry = CollectorRegistry()
        reg, labels, value = self._registry, ["rank"], str(rank)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=reg).labels(rank=value)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=reg).labels(rank=value)

        self._step = gauge("nerf_global_step", "Optimizer step")
        self._world = gauge("nerf_world_size", "Number of training processes (ranks)")
        self._rays_ps = gauge("nerf_rays_per_second", "Rays per second over the latest window")
        self._samples_ps = gauge("nerf_samples_per_second", "Ray-marching samples per second, latest window")
        self._spr = gauge("nerf_samples_per_ray", "Samples per ray over the latest window")
        self._step_s = gauge("nerf_step_time_seconds", "Mean optimizer-step time over the latest window")
        self._rays = counter("nerf_rays", "Rays trained on")
        self._samples = counter("nerf_samples", "Ray-marching samples evaluated")
        self._loss = gauge("nerf_train_loss", "Training loss at the latest window's step")
        self._psnr = gauge("nerf_train_psnr_db", "Training-batch PSNR in dB at the latest window's step")
        # Families without samples until the device reports them (none on CPU).
        self._gpu_util = Gauge("nerf_gpu_utilization_percent", "GPU utilization (NVML)", labels, registry=reg)
        self._gpu_used = Gauge("nerf_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels, registry=reg)
        self._gpu_peak = Gauge(
            "nerf_gpu_memory_peak_bytes", "Allocator peak memory, latest window", labels, registry=reg
        )
        self._rank_label = value
        self._job: dict[str, Any] = {}
        if rank == 0:
            self._job = {
                "perf/rays_per_s": gauge("nerf_job_rays_per_second", "Rays per second, all ranks"),
                "perf/samples_per_s": gauge("nerf_job_samples_per_second", "Samples per second, all ranks"),
                "perf/step_time_ms": gauge("nerf_job_step_time_seconds", "Step time of the slowest rank"),
            }
        self._world.set(world_size)

    # ----------------------------------------------------------------------------- updates
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._server is None:
            return
        self._step.set(trainer.global_step)  # a host integer: no device sync
        monitor = self._monitor
        if monitor is None or monitor.latest_step == self._seen_step or monitor.latest_step < 0:
            return
        # The monitor has just synchronized with the device for its reading: reading the logged loss
        # and PSNR now costs no extra wait.
        self._seen_step = monitor.latest_step
        self._update(monitor.latest_local, monitor.latest, trainer.callback_metrics)

    def _update(self, local: dict[str, float], total: dict[str, float], logged: dict[str, Any]) -> None:
        seconds = max(local["seconds"], 1e-9)
        steps = max(local["steps"], 1.0)
        self._rays_ps.set(local["rays"] / seconds)
        self._samples_ps.set(local["samples"] / seconds)
        self._spr.set(local["samples"] / max(local["rays"], 1.0))
        self._step_s.set(seconds / steps)
        # counters follow the module's device counters (monotonic within a run)
        self._rays.inc(max(local["rays_seen"] - self._rays_seen, 0.0))
        self._samples.inc(max(local["samples_seen"] - self._samples_seen, 0.0))
        self._rays_seen, self._samples_seen = local["rays_seen"], local["samples_seen"]
        for key, metric in (("train/loss", self._loss), ("train/psnr", self._psnr)):
            if key in logged:
                value = float(logged[key])
                if math.isfinite(value):
                    metric.set(value)
        r = self._rank_label
        if local["gpu_util"] >= 0:
            self._gpu_util.labels(rank=r).set(local["gpu_util"])
        if local["mem_used_gb"] >= 0:
            self._gpu_used.labels(rank=r).set(local["mem_used_gb"] * _GB)
        if local["mem_peak_gb"] >= 0:
            self._gpu_peak.labels(rank=r).set(local["mem_peak_gb"] * _GB)
        for key, metric in self._job.items():
            if key in total:
                metric.set(total[key] / 1e3 if key.endswith("_ms") else total[key])
