"""The W&B logger without a server: mode decision and fallback, offline read-back, run ids, config."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import hydra
import pytest

from nerf_lightning.tracking import wandb_logger
from nerf_lightning.tracking.wandb_logger import RUN_ID_FILE, WandbLogger, finish_loggers
from nerf_lightning.tracking.wandb_mode import resolve_wandb_mode, wandb_has_credentials, wandb_host
from nerf_lightning.tracking.wandb_offline import read_offline_run


@pytest.fixture
def no_wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No key in the environment, a HOME without netrc, W&B's own files under tmp_path; W&B's service
    stopped afterwards.

    ``wandb.init`` starts a service process for the test process. Left running, it would be killed with
    the test process's other children when the session ends (``conftest.py``), and W&B's exit hook would
    then print a traceback trying to reach it: a test that starts W&B tears it down."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / ".cache" / "wandb"))
    yield home
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


# ------------------------------------------------------------------------------ mode decision
def test_mode_offline_without_key(no_wandb_env: Path) -> None:
    assert not wandb_has_credentials()
    assert resolve_wandb_mode("auto") == ("offline", "no W&B API key")
    assert resolve_wandb_mode("online")[0] == "offline"  # never a login prompt


def test_mode_key_from_netrc_but_host_unreachable(no_wandb_env: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on 127.0.0.1:443
    (no_wandb_env / ".netrc").write_text("machine 127.0.0.1\n  login user\n  password abc123\n")
    assert wandb_host() == "127.0.0.1"
    assert wandb_has_credentials()
    mode, reason = resolve_wandb_mode("auto", timeout_s=0.5)
    assert (mode, reason) == ("offline", "127.0.0.1 unreachable")
    # an entry for another host is not a key for this one
    (no_wandb_env / ".netrc").write_text("machine example.com login u password p\n")
    assert not wandb_has_credentials()


def test_mode_env_and_explicit(no_wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode("auto")[0] == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode("auto")[0] == "offline"
    with pytest.raises(ValueError, match="logger.wandb.mode"):
        resolve_wandb_mode("sometimes")


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

    monkeypatch.setattr(wandb_logger, "resolve_wandb_mode", lambda mode, timeout_s=2.0: ("online", "test"))
    monkeypatch.setattr(wandb, "init", flaky_init)
    logger = WandbLogger(save_dir=str(tmp_path / "run"), project="p", group="g", tags=["t1"], name="n")
    logger.log_hyperparams({"model": {"lr": 0.01}})
    logger.log_metrics({"perf/samples_per_s": 123.0}, step=1)
    logger.log_metrics({"perf/samples_per_s": 456.0, "train/loss": 0.5}, step=2)
    assert modes == ["online", "offline"] and logger.mode == "offline"
    run_dir = logger.offline_dir
    finish_loggers([logger], {"val/psnr": 21.5, "steps": 2, "bad": float("nan")})
    assert logger._experiment is None

    out = capsys.readouterr().out
    sync = [line for line in out.splitlines() if "wandb sync" in line]
    assert sync == [f"W&B offline (wandb.init online failed): upload with `wandb sync {run_dir}`"]

    # wandb's service may still be flushing the run file for a moment after finish() returns.
    for _ in range(200):
        run = read_offline_run(run_dir)
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
    first = WandbLogger(save_dir=str(run), mode="offline", name="n")
    run_id = first.experiment.id
    first.experiment.finish()
    assert (run / RUN_ID_FILE).read_text().strip() == run_id
    again = WandbLogger(save_dir=str(run), mode="offline", name="n")
    assert (again._wandb_init["id"], again._wandb_init["resume"]) == (run_id, "allow")
    other = WandbLogger(save_dir=str(tmp_path / "other"), mode="offline", name="n")
    assert other._wandb_init["id"] != run_id
    explicit = WandbLogger(save_dir=str(tmp_path / "x"), mode="offline", id="abc123")
    assert explicit._wandb_init["id"] == "abc123"


def test_read_offline_run_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "run-x.wandb").write_bytes(b"not a log")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        read_offline_run(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_offline_run(tmp_path / "missing")


def test_wandb_logger_config(compose_cfg, no_wandb_env: Path) -> None:
    cfg = compose_cfg("logger=wandb", "tags=[a,b]")
    node = cfg.logger.wandb
    assert node.mode == "auto" and node.group == "auto" and list(node.tags) == ["a", "b"]
    logger = hydra.utils.instantiate(node)
    assert isinstance(logger, WandbLogger)
    assert logger.mode == "offline" and logger._wandb_init["group"] == "train"  # a single run: task name
    assert logger._wandb_init["name"] is None and logger._wandb_init["tags"] == ["a", "b"]
