"""Prometheus exporter: a short CPU run is scraped mid-training and the text format parsed; per-rank ports,
the numbers of a known window, clear errors; the Grafana dashboard only queries series that exist."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

from nerf_lightning.apps.train import train
from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.run.config import compose_train_config
from nerf_lightning.tracking.prometheus import PrometheusExporter

from .conftest import REPO_ROOT, TINY_RUN, free_port

text_string_to_metric_families = pytest.importorskip(
    "prometheus_client.parser"
).text_string_to_metric_families

BATCH = 128  # rays per step in TINY_RUN
SCRAPE_AT = 10  # optimizer step of the mid-run scrape; throughput windows of 5 steps
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "nerf_lightning.json"


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _samples(text: str) -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted label items: value}}`` of a scrape, via prometheus_client's own parser."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


class ScrapeMidRun(L.Callback):
    """Scrapes the exporter of its own run at step ``SCRAPE_AT`` (after the exporter's update)."""

    found: dict[str, Any] = {}

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != SCRAPE_AT or "text" in ScrapeMidRun.found:
            return
        exporter = next(cb for cb in trainer.callbacks if isinstance(cb, PrometheusExporter))
        ScrapeMidRun.found.update(
            text=_get(exporter.bound_port),
            port=exporter.bound_port,
            loss=float(trainer.callback_metrics["train/loss"]),
            psnr=float(trainer.callback_metrics["train/psnr"]),
        )


def scrape_a_run(scene: Path, out: Path, *overrides: str) -> dict[str, Any]:
    """Train a few steps with the exporter on a free port; what ``ScrapeMidRun`` saw at step 10."""
    cfg = compose_train_config(
        [
            f"data.path={scene}",
            "trainer.max_steps=12",
            "callbacks.prometheus.port=0",
            "callbacks.prometheus.addr=127.0.0.1",
            "callbacks.throughput.log_every_n_steps=5",
            # the module logs loss/PSNR on the loggers' steps only (no host sync on the others)
            "trainer.log_every_n_steps=5",
            *TINY_RUN,
            *overrides,
        ],
        out,
    )
    with open_dict(cfg):
        cfg.callbacks.scrape = {"_target_": f"{__name__}.ScrapeMidRun"}
    ScrapeMidRun.found = {}
    try:
        train(cfg)
    finally:
        GlobalHydra.instance().clear()
    assert "text" in ScrapeMidRun.found, "the run never reached the scrape step"
    return dict(ScrapeMidRun.found)


@pytest.fixture(scope="module")
def scraped(tiny_scene: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.set_num_threads(2)
    return scrape_a_run(tiny_scene, tmp_path_factory.mktemp("prometheus"))


@pytest.mark.slow
def test_scrape_during_a_run(scraped: dict[str, Any]) -> None:
    s = _samples(scraped["text"])
    r0 = (("rank", "0"),)
    assert s["nerf_global_step"][r0] == SCRAPE_AT
    assert s["nerf_world_size"][r0] == 1
    # counters: every ray of the 10 steps of 256 rays, more samples than rays
    assert s["nerf_rays_total"][r0] == BATCH * SCRAPE_AT
    assert s["nerf_samples_total"][r0] > s["nerf_rays_total"][r0]
    # the latest window (steps 5..10): rays/s x s/step = rays per step
    assert s["nerf_rays_per_second"][r0] * s["nerf_step_time_seconds"][r0] == pytest.approx(BATCH, rel=1e-9)
    assert s["nerf_step_time_seconds"][r0] > 0
    assert 1.0 < s["nerf_samples_per_ray"][r0] <= 32  # model.net.renderer.max_samples_per_ray=32
    assert s["nerf_samples_per_second"][r0] == pytest.approx(
        s["nerf_rays_per_second"][r0] * s["nerf_samples_per_ray"][r0], rel=1e-9
    )
    # loss and PSNR of that step, as the module logged them
    assert s["nerf_train_loss"][r0] == pytest.approx(scraped["loss"], rel=1e-6)
    assert s["nerf_train_psnr_db"][r0] == pytest.approx(scraped["psnr"], rel=1e-6)
    # rank 0 also serves the whole job's numbers (one rank here: the same)
    assert s["nerf_job_rays_per_second"][r0] == pytest.approx(s["nerf_rays_per_second"][r0], rel=1e-9)
    assert s["nerf_job_step_time_seconds"][r0] == pytest.approx(s["nerf_step_time_seconds"][r0], rel=1e-9)
    # GPU series are declared, without samples on a CPU
    families = _families(scraped["text"])
    for name in ("nerf_gpu_utilization_percent", "nerf_gpu_memory_used_bytes", "nerf_gpu_memory_peak_bytes"):
        assert families[name] == "gauge" and name not in s
    assert families["nerf_rays"] == "counter"
    # the server is gone with the run
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(scraped["port"])


@pytest.mark.slow
def test_grafana_dashboard_queries_exported_series(scraped: dict[str, Any]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = set(_samples(scraped["text"])) | set(_families(scraped["text"]))
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(panels) >= 8 and all(p.get("targets") for p in panels)
    queried = {m for e in exprs for m in re.findall(r"\bnerf_[a-z_]+\b", e)}
    for needed in (
        "nerf_rays_total",
        "nerf_samples_per_second",
        "nerf_step_time_seconds",
        "nerf_train_loss",
        "nerf_train_psnr_db",
        "nerf_gpu_utilization_percent",
        "nerf_gpu_memory_used_bytes",
        "nerf_global_step",
    ):
        assert needed in queried, f"dashboard has no panel for {needed}"
    assert queried <= exported, f"dashboard queries series nobody exports: {sorted(queried - exported)}"
    # every query is scoped by the dashboard's job variable, so two runs never mix
    assert all('job=~"$job"' in e for e in exprs), exprs
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"datasource", "job"}


@pytest.mark.cuda
def test_gpu_series_on_a_gpu(tiny_scene: Path, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    s = _samples(scrape_a_run(tiny_scene, tmp_path, "accelerator=gpu")["text"])
    r0 = (("rank", "0"),)
    assert 0.0 <= s["nerf_gpu_utilization_percent"][r0] <= 100.0
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0.0 < s["nerf_gpu_memory_used_bytes"][r0] <= total
    assert 0.0 < s["nerf_gpu_memory_peak_bytes"][r0] <= s["nerf_gpu_memory_used_bytes"][r0]
    assert s["nerf_rays_total"][r0] == BATCH * SCRAPE_AT


# ------------------------------------------------------------------------------- unit tests
def _trainer(rank: int, local_rank: int, world: int, callbacks: list) -> SimpleNamespace:
    return SimpleNamespace(
        callbacks=callbacks,
        global_rank=rank,
        local_rank=local_rank,
        world_size=world,
        global_step=0,
        callback_metrics={},
    )


def _free_pair() -> int:
    for _ in range(20):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    pytest.skip("no two consecutive free ports")


def test_every_rank_serves_on_port_plus_local_rank() -> None:
    port = _free_pair()
    monitor = ThroughputMonitor()
    trainer = _trainer(rank=3, local_rank=1, world=4, callbacks=[monitor])
    exporter = PrometheusExporter(port=port, addr="127.0.0.1")
    exporter.setup(trainer, None, "fit")
    try:
        assert exporter.bound_port == port + 1
        s = _samples(_get(port + 1))
        assert s["nerf_world_size"] == {(("rank", "3"),): 4.0}
        assert not any(name.startswith("nerf_job_") for name in s)  # the job totals are rank 0's

        # a known window: 5 steps of 1024 rays in 2 s, 20 samples per ray, GPU counters
        trainer.global_step = 5
        monitor.latest_step, monitor.latest = 5, {"perf/rays_per_s": 1.0}
        monitor.latest_local = {
            "rays": 5120.0,
            "samples": 102400.0,
            "seconds": 2.0,
            "steps": 5.0,
            "gpu_util": 87.0,
            "mem_peak_gb": 0.25,
            "mem_used_gb": 1.5,
            "rays_seen": 5120.0,
            "samples_seen": 102400.0,
        }
        trainer.callback_metrics = {"train/loss": torch.tensor(0.125), "train/psnr": torch.tensor(18.5)}
        exporter.on_train_batch_end(trainer, None, None, None, 4)
        s = _samples(_get(port + 1))
        r = (("rank", "3"),)
        assert s["nerf_rays_per_second"][r] == 2560.0
        assert s["nerf_samples_per_second"][r] == 51200.0
        assert s["nerf_samples_per_ray"][r] == 20.0
        assert s["nerf_step_time_seconds"][r] == 0.4
        assert s["nerf_gpu_utilization_percent"][r] == 87.0
        assert s["nerf_gpu_memory_used_bytes"][r] == 1610612736.0
        assert s["nerf_gpu_memory_peak_bytes"][r] == 268435456.0
        assert (s["nerf_train_loss"][r], s["nerf_train_psnr_db"][r]) == (0.125, 18.5)
        assert s["nerf_global_step"][r] == 5
        assert s["nerf_rays_total"][r] == 5120.0

        # the same window again changes nothing; the next one adds only its own rays
        exporter.on_train_batch_end(trainer, None, None, None, 5)
        monitor.latest_step = 10
        monitor.latest_local = dict(monitor.latest_local, rays_seen=10240.0, samples_seen=204800.0)
        exporter.on_train_batch_end(trainer, None, None, None, 9)
        s = _samples(_get(port + 1))
        assert s["nerf_rays_total"][r] == 10240.0 and s["nerf_samples_total"][r] == 204800.0
    finally:
        exporter.close()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(port + 1)


def test_busy_port_and_missing_monitor_are_clear_errors() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        exporter = PrometheusExporter(port=port, addr="127.0.0.1")
        with pytest.raises(OSError, match=r"callbacks\.prometheus\.port"):
            exporter.setup(_trainer(0, 0, 1, [ThroughputMonitor()]), None, "fit")
    with pytest.raises(ValueError, match=r"callbacks\.throughput"):
        PrometheusExporter(port=0).setup(_trainer(0, 0, 1, []), None, "fit")
    with pytest.raises(ValueError, match=r"^callbacks.prometheus.port=70000: expected an integer >= 0 and"):
        PrometheusExporter(port=70000)
    off = PrometheusExporter(port=None)
    off.setup(_trainer(0, 0, 1, []), None, "fit")  # off: no server, no requirement
    assert off.bound_port is None


def test_off_by_default(compose_cfg) -> None:
    cfg = compose_cfg()
    assert cfg.callbacks.prometheus.port is None
    keys = list(cfg.callbacks)
    assert keys.index("throughput") < keys.index("prometheus")  # reads the window of the same step
