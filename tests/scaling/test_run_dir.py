"""One run directory per job: the run id each launcher gives all of its processes, per-rank file names."""

from __future__ import annotations

import pytest
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.run import run_dir
from nerf_lightning.run.config import compose_train_config

FALLBACK = "2026-01-01_00-00-00"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, FALLBACK),
        ({"TORCHELASTIC_RUN_ID": "none"}, FALLBACK),  # torchrun's default: not an id
        ({"TORCHELASTIC_RUN_ID": "job 7/a"}, "torchrun-job-7-a"),  # made safe for a folder name
        ({"SLURM_JOB_ID": "123"}, "slurm-123"),
        ({"SLURM_JOB_ID": "124", "SLURM_ARRAY_JOB_ID": "120", "SLURM_ARRAY_TASK_ID": "4"}, "slurm-120_4"),
        ({"SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "abc"}, "slurm-123"),  # kept across requeues
        ({"NERF_LIGHTNING_RUN_ID": "exp1", "SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "abc"}, "exp1"),
    ],
)
def test_run_id(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert run_dir.run_id(FALLBACK) == expected


@pytest.mark.parametrize(
    ("env", "tag"),
    [
        ({}, None),
        ({"RANK": "0", "LOCAL_RANK": "0"}, None),
        ({"RANK": "3", "LOCAL_RANK": "1"}, "rank3"),
        ({"SLURM_PROCID": "2"}, "rank2"),
        ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, "node0_local1"),  # a child of Lightning's own launcher
        ({"NODE_RANK": "2"}, "node2_local0"),
    ],
)
def test_rank_tag(
    env: dict[str, str], tag: str | None, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert run_dir.rank_tag() == tag
    assert run_dir.rank_suffix() == ("" if tag is None else f"_{tag}")
    assert run_dir.rank_zero_only(".hydra") == (".hydra" if tag is None else None)


def test_hydra_config_uses_the_run_id(
    tmp_path, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    def hydra_cfg():
        try:
            return compose_train_config([], tmp_path).hydra
        finally:
            GlobalHydra.instance().clear()

    alone = hydra_cfg()
    assert alone.run.dir.startswith("outputs/runs/train/20")  # the launch time
    # .hydra/ is written by the app once its checks have passed (tests/run/test_folder_commit.py)
    assert alone.output_subdir is None and alone.job_logging.handlers.file.filename.endswith("/train.log")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setenv("RANK", "1")
    ranked = hydra_cfg()
    assert ranked.run.dir == "outputs/runs/train/torchrun-r1"
    assert ranked.output_subdir is None
    assert ranked.job_logging.handlers.file.filename.endswith("/train_rank1.log")
