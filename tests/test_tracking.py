"""Tracking pieces without training: W&B mode decision and fallback, offline run read-back, sweep summary,
throughput/sampler metrics, logger and preset configs."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import hydra
import pytest
import torch
from hydra.types import RunMode
from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from nerf_lightning.callbacks.lr_monitor import LearningRateMonitor
from nerf_lightning.callbacks.sampler_monitor import SamplerMonitor
from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.train import normalize_overrides
from nerf_lightning.utils import tracking


@pytest.fixture
def no_wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No key in the environment, a HOME without netrc, W&B's own files under tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / ".cache" / "wandb"))
    return home


# ------------------------------------------------------------------------------ mode decision
def test_mode_offline_without_key(no_wandb_env: Path) -> None:
    assert not tracking.wandb_has_credentials()
    assert tracking.resolve_wandb_mode("auto") == ("offline", "no W&B API key")
    assert tracking.resolve_wandb_mode("online")[0] == "offline"  # never a login prompt


def test_mode_key_from_netrc_but_host_unreachable(no_wandb_env: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on 127.0.0.1:443
    (no_wandb_env / ".netrc").write_text("machine 127.0.0.1\n  login user\n  password abc123\n")
    assert tracking.wandb_host() == "127.0.0.1"
    assert tracking.wandb_has_credentials()
    mode, reason = tracking.resolve_wandb_mode("auto", timeout_s=0.5)
    assert (mode, reason) == ("offline", "127.0.0.1 unreachable")
    # an entry for another host is not a key for this one
    (no_wandb_env / ".netrc").write_text("machine example.com login u password p\n")
    assert not tracking.wandb_has_credentials()


def test_mode_env_and_explicit(no_wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.resolve_wandb_mode("auto")[0] == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert tracking.resolve_wandb_mode("auto")[0] == "offline"
    with pytest.raises(ValueError, match="logger.wandb.mode"):
        tracking.resolve_wandb_mode("sometimes")


def test_failed_online_init_falls_back_offline_and_reads_back(
    no_wandb_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """An online wandb.init that raises (bad key, server down) leaves an offline run; metrics read back."""
    import wandb

    real_init = wandb.init
    modes = []

    def flaky_init(*args, **kwargs):
        modes.append(kwargs.get("mode"))
        if kwargs.get("mode") == "online":
            raise wandb.errors.CommError("server unreachable")
        return real_init(*args, **kwargs)

    monkeypatch.setattr(tracking, "resolve_wandb_mode", lambda mode, timeout_s=2.0: ("online", "test"))
    monkeypatch.setattr(wandb, "init", flaky_init)
    logger = tracking.WandbLogger(save_dir=str(tmp_path / "run"), project="p", group="g", tags=["t1"],
                                  name="n")
    logger.log_hyperparams({"model": {"lr": 0.01}})
    logger.log_metrics({"perf/samples_per_s": 123.0}, step=1)
    logger.log_metrics({"perf/samples_per_s": 456.0, "train/loss": 0.5}, step=2)
    assert modes == ["online", "offline"] and logger.mode == "offline"
    run_dir = logger.offline_dir
    tracking.finish_loggers([logger], {"val/psnr": 21.5, "steps": 2, "bad": float("nan")})
    assert logger._experiment is None

    out = capsys.readouterr().out
    sync = [line for line in out.splitlines() if "wandb sync" in line]
    assert sync == [f"W&B offline (wandb.init online failed): upload with `wandb sync {run_dir}`"]

    # wandb's service may still be flushing the run file for a moment after finish() returns.
    for _ in range(200):
        run = tracking.read_offline_run(run_dir)
        if run["group"] and "model" in run["config"] and "val/psnr" in run["summary"]:
            break
        time.sleep(0.1)
    assert (run["group"], run["tags"], run["name"]) == ("g", ["t1"], "n")
    assert run["config"]["model"] == {"lr": 0.01}
    logged = [row["perf/samples_per_s"] for row in run["history"] if "perf/samples_per_s" in row]
    assert logged == [123.0, 456.0]
    assert run["summary"]["val/psnr"] == 21.5 and run["summary"]["train/loss"] == 0.5
    assert "bad" not in run["summary"]


def test_a_restarted_run_logs_into_the_same_wandb_run(no_wandb_env: Path, tmp_path: Path) -> None:
    """ckpt_path=last / resume=auto / a SLURM requeue restart in the same run folder: same W&B run id."""
    run = tmp_path / "run"
    first = tracking.WandbLogger(save_dir=str(run), mode="offline", name="n")
    run_id = first.experiment.id
    first.experiment.finish()
    assert (run / tracking.RUN_ID_FILE).read_text().strip() == run_id
    again = tracking.WandbLogger(save_dir=str(run), mode="offline", name="n")
    assert (again._wandb_init["id"], again._wandb_init["resume"]) == (run_id, "allow")
    other = tracking.WandbLogger(save_dir=str(tmp_path / "other"), mode="offline", name="n")
    assert other._wandb_init["id"] != run_id
    explicit = tracking.WandbLogger(save_dir=str(tmp_path / "x"), mode="offline", id="abc123")
    assert explicit._wandb_init["id"] == "abc123"


def test_read_offline_run_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "run-x.wandb").write_bytes(b"not a log")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        tracking.read_offline_run(tmp_path)
    with pytest.raises(FileNotFoundError):
        tracking.read_offline_run(tmp_path / "missing")


# ---------------------------------------------------------------------------- sweep summary
def _fake_job(sweep: Path, num: int, overrides: list[str], metrics: dict | None) -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))


def test_sweep_summary_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = tmp_path / "sweep"
    common = ["data.path=/x", "trainer.max_steps=10"]
    for num, size, psnr in ((0, 15, 20.0), (1, 17, 24.5), (10, 19, None)):
        metrics = None if psnr is None else {"val/psnr": psnr, "train/samples_per_s": 1e6 * (num + 1)}
        if metrics is not None:  # nested per-view tables and the split name, as train.py writes them
            metrics.update({"val/per_view": {"view": [0], "psnr": [psnr]}, "eval/split": "val"})
        _fake_job(sweep, num, [*common, f"model.field.encoding.log2_hashmap_size={size}"], metrics)
    csv_path = tracking.write_sweep_summary(sweep, "val/psnr", "maximize")
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "10"]  # numeric order, not "0, 1, 10" by luck of strings
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    assert rows[1]["sweep_overrides"] == "model.field.encoding.log2_hashmap_size=17"
    assert rows[1]["overrides"] == " ".join([*common, "model.field.encoding.log2_hashmap_size=17"])
    assert [r["val/psnr"] for r in rows] == ["20.0", "24.5", ""]
    assert list(rows[0])[4] == "val/psnr"  # the optimized metric is the first metric column
    assert "val/per_view" not in rows[0] and rows[0]["eval/split"] == "val"  # no dict-valued columns
    out = capsys.readouterr().out
    assert "24.5" in out and "failed" in out and "summary.csv" in out
    assert tracking.write_sweep_summary(tmp_path / "empty") is None


# ---------------------------------------------------------------------- callbacks' arithmetic
def test_throughput_window_metrics_aggregate_ranks() -> None:
    mon = ThroughputMonitor(per_rank=True)
    # [rays, samples, seconds, steps, util %, peak GB, used GB] for two ranks
    record = torch.tensor([[1000.0, 50000.0, 2.0, 10.0, 80.0, 1.5, 3.0],
                           [1000.0, 30000.0, 4.0, 10.0, 60.0, 2.5, 3.5]], dtype=torch.float64)
    m = mon._window_metrics(record)
    assert m["perf/rays_per_s"] == pytest.approx(500.0 + 250.0)  # sum of the ranks' rates
    assert m["perf/samples_per_s"] == pytest.approx(25000.0 + 7500.0)
    assert m["perf/samples_per_ray"] == pytest.approx(40.0)
    assert m["perf/step_time_ms"] == pytest.approx(400.0)  # the slowest rank
    assert m["gpu/utilization"] == pytest.approx(70.0) and m["gpu/mem_peak_gb"] == 2.5
    assert m["perf/rank1/samples_per_s"] == pytest.approx(7500.0) and m["gpu/rank0/utilization"] == 80.0
    cpu = mon._window_metrics(torch.tensor([[10.0, 20.0, 1.0, 2.0, -1.0, -1.0, -1.0]], dtype=torch.float64))
    assert "gpu/utilization" not in cpu and "perf/rank0/samples_per_s" not in cpu
    assert cpu["perf/step_time_ms"] == pytest.approx(500.0)


def test_throughput_summary_counts_this_sessions_steps_after_a_resume() -> None:
    """Lightning restores a checkpoint's global step after ``on_fit_start``: a run resumed at step 120
    that trains 10 more steps reports steps = 130 and the time per step over those 10."""
    mon = ThroughputMonitor()
    trainer = SimpleNamespace(global_step=0, log_every_n_steps=50, state=SimpleNamespace(fn="fit"),
                              strategy=SimpleNamespace(root_device=torch.device("cpu")))
    module = SimpleNamespace(rays_seen=torch.tensor(0.0), samples_seen=torch.tensor(0.0))
    mon.on_fit_start(trainer, module)
    trainer.global_step = 120  # the loops' state is restored here
    mon.on_train_start(trainer, module)
    assert mon.summary()["steps"] == 120 and "perf/step_time_ms" not in mon.summary()
    mon.on_train_epoch_start(trainer, module)
    time.sleep(0.01)
    trainer.global_step = 130
    module.rays_seen += 10 * 64
    mon.on_validation_start(trainer, module)  # stops the training clock
    out = mon.summary()
    assert out["steps"] == 130 and out["time/train_s"] >= 0.01
    assert out["perf/step_time_ms"] == pytest.approx(out["time/train_s"] / 10 * 1e3)
    assert out["train/rays_per_s"] == pytest.approx(640 / out["time/train_s"])


def test_sampler_stats() -> None:
    uniform = SamplerMonitor.stats(torch.full((8,), 1 / 8))
    assert uniform["sampler/effective_views"] == pytest.approx(8.0)
    peaked = SamplerMonitor.stats(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert peaked["sampler/effective_views"] == pytest.approx(1.0)
    assert (peaked["sampler/view_prob_min"], peaked["sampler/view_prob_max"]) == (0.0, 1.0)
    half = SamplerMonitor.stats(torch.tensor([0.5, 0.5, 0.0]))
    assert half["sampler/effective_views"] == pytest.approx(2.0)
    # unnormalized weights are normalized first: exp(entropy) of (1/4, 1/4, 1/2) is 2^1.5
    skewed = SamplerMonitor.stats(torch.tensor([1.0, 1.0, 2.0]))
    assert skewed["sampler/effective_views"] == pytest.approx(2**1.5)
    assert (skewed["sampler/view_prob_min"], skewed["sampler/view_prob_max"]) == pytest.approx((0.25, 0.5))


def test_lr_monitor_is_a_noop_without_logger() -> None:
    # a trainer with no loggers and nothing else: any use of it beyond `loggers` would raise
    trainer = SimpleNamespace(loggers=[])
    with pytest.raises(MisconfigurationException, match="has no logger"):
        LightningLearningRateMonitor().on_train_start(trainer)  # what the subclass exists to avoid
    monitor = LearningRateMonitor(logging_interval="step")
    monitor.on_train_start(trainer)
    monitor.on_train_epoch_start(trainer)
    monitor.on_train_batch_start(trainer, None, None, 0)
    assert not monitor._active
    # (with a logger it logs: tests/test_train_e2e.py reads its lr-Adam column back from the CSV log)


def test_tensorboard_logger_logs_images(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = tracking.TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="")
    image = torch.zeros(4, 8, 3, dtype=torch.uint8)
    image[:, 4:] = 255
    logger.log_image(key="val/panel", images=[image.numpy()], step=3)
    logger.finalize("success")
    acc = EventAccumulator(str(Path(logger.log_dir))).Reload()
    (event,) = acc.Images("val/panel")
    assert (event.step, event.width, event.height) == (3, 8, 4)


# -------------------------------------------------------------------------------------- config
def test_encoding_alias() -> None:
    assert normalize_overrides(["model.encoding.log2_hashmap_size=15,17,19", "+model.encoding.x=1",
                                "model.field.encoding.n_levels=8", "precision=32"]) == [
        "model.field.encoding.log2_hashmap_size=15,17,19", "+model.field.encoding.x=1",
        "model.field.encoding.n_levels=8", "precision='32'"]


def test_wandb_logger_config(compose_cfg, no_wandb_env: Path) -> None:
    cfg = compose_cfg("logger=wandb", "tags=[a,b]")
    node = cfg.logger.wandb
    assert node.mode == "auto" and node.group == "auto" and list(node.tags) == ["a", "b"]
    logger = hydra.utils.instantiate(node)
    assert isinstance(logger, tracking.WandbLogger)
    assert logger.mode == "offline" and logger._wandb_init["group"] == "train"  # a single run: task name
    assert logger._wandb_init["name"] is None and logger._wandb_init["tags"] == ["a", "b"]


def test_experiment_presets(compose_cfg, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NERF_LIGHTNING_FOX", raising=False)
    cfg = compose_cfg("experiment=fox")
    with pytest.raises(InterpolationResolutionError, match="NERF_LIGHTNING_FOX"):
        OmegaConf.to_container(cfg.data, resolve=True)  # says which variable (or data.path) is missing
    monkeypatch.setenv("NERF_LIGHTNING_FOX", str(tmp_path))
    cfg = compose_cfg("experiment=fox")
    assert cfg.data.path == str(tmp_path) and cfg.data.format == "ngp"
    assert cfg.model.cone_angle == pytest.approx(1 / 256)
    assert compose_cfg("experiment=fox", "data.path=/data/fox").data.path == "/data/fox"

    blender = compose_cfg("experiment=blender", "data.path=/data/lego")
    assert (blender.data.format, blender.model.cone_angle) == ("blender", 0.0)
    fast, quality, default = compose_cfg("experiment=fast"), compose_cfg("experiment=quality"), compose_cfg()
    assert fast.trainer.max_steps < default.trainer.max_steps < quality.trainer.max_steps
    assert (fast.model.field.encoding.log2_hashmap_size < default.model.field.encoding.log2_hashmap_size
            < quality.model.field.encoding.log2_hashmap_size)


def test_optuna_config(compose_cfg) -> None:
    cfg = compose_cfg("hparams_search=optuna")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert set(sweeper.params) == {"model.field.encoding.log2_hashmap_size", "model.field.encoding.n_levels",
                                   "model.optimizer.lr"}
    assert cfg.optimized_metric == "val/psnr" and cfg.hydra.mode == RunMode.MULTIRUN
    callbacks = cfg.hydra.callbacks
    assert callbacks.multirun_summary._target_ == "nerf_lightning.utils.tracking.MultirunSummary"
