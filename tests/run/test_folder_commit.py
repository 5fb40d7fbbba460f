"""The run folder is written once the app's checks have passed: ``.hydra/`` and the log are held until then.

The end-to-end behaviour (a refused command into a finished run leaves it byte-identical) is in
``tests/apps/test_refused_runs.py``; here the pieces, on a config composed as a job's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.run import folder_commit
from nerf_lightning.run.config import compose_train_config
from nerf_lightning.run.folder_commit import (
    HeldFileHandler,
    commit_run_folder,
    end_run_folder,
    hold_run_folder,
)

log = logging.getLogger("nerf_lightning.test_folder_commit")


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``job(folder, rank=0)``: a job's config into ``folder``, its log handler on the root logger."""
    handlers: list[HeldFileHandler] = []
    monkeypatch.setattr(folder_commit, "_held", None)
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(key, raising=False)

    def _job(folder: Path, rank: int = 0) -> HeldFileHandler:
        folder.mkdir(parents=True, exist_ok=True)  # as Hydra's run_job does before the job starts
        monkeypatch.setenv("RANK", str(rank))
        try:
            config = compose_train_config(["seed=3", "trainer.max_steps=7"], folder)
        finally:
            GlobalHydra.instance().clear()
        handler = HeldFileHandler(str(folder / "train.log"))
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger().addHandler(handler)
        handlers.append(handler)
        hold_run_folder(config)
        return handler

    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    yield _job
    logging.getLogger().setLevel(level)
    for handler in handlers:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_nothing_is_written_before_the_commit_and_everything_after(job, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    job(folder)
    log.info("checking the config")
    assert _files(folder) == {}
    commit_run_folder()
    log.info("training")
    files = _files(folder)
    assert sorted(files) == [".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log"]
    assert files[".hydra/overrides.yaml"] == b"- seed=3\n- trainer.max_steps=7\n"  # as Hydra writes it
    assert b"seed: 3\n" in files[".hydra/config.yaml"] and b"max_steps: 7\n" in files[".hydra/config.yaml"]
    assert b"\nhydra:\n" in b"\n" + files[".hydra/hydra.yaml"]
    assert files["train.log"] == b"checking the config\ntraining\n"  # the held line first


def test_an_uncommitted_command_leaves_an_earlier_folder_as_it_was(job, tmp_path: Path) -> None:
    folder = tmp_path / "finished"
    folder.mkdir()
    (folder / "metrics.json").write_text("{}")
    (folder / "train.log").write_text("the finished run's log\n")
    before = _files(folder)
    job(folder)
    log.error("error: data.shard=maybe: expected one of True, False, auto")
    assert end_run_folder() == (folder, False)
    log.info("after the end")
    assert _files(folder) == before


def test_an_uncommitted_command_keeps_its_record_in_a_folder_of_its_own(job, tmp_path: Path) -> None:
    folder = tmp_path / "new"
    job(folder)
    log.error("error: data.shard=maybe: expected one of True, False, auto")
    assert end_run_folder() == (folder, True)
    files = _files(folder)
    assert files["train.log"] == b"error: data.shard=maybe: expected one of True, False, auto\n"
    assert ".hydra/overrides.yaml" in files
    assert end_run_folder() is None  # ended once


def test_only_rank_0_writes_hydra(job, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    job(folder, rank=1)
    log.info("rank 1 trains")
    commit_run_folder()
    assert sorted(_files(folder)) == ["train.log"]
