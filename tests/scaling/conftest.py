"""Fixtures for the scaling-out tests: a tiny capture, a clean launcher environment, free ports."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from runs import child_env

from nerf_lightning.data.synthetic import generate_scene

REPO_ROOT = Path(__file__).resolve().parents[2]

# A run that takes a couple of seconds per process on a CPU: small grid, coarse marching, few steps.
TINY_RUN = [
    "accelerator=cpu",
    "experiment=cpu",
    "logger=none",
    "callbacks.progress_bar=null",
    "data.batch_size=128",
    "data.steps_per_epoch=16",
    "model.net.renderer.occupancy.resolution=16",
    "model.net.renderer.occupancy.warmup_steps=4",
    "model.net.renderer.occupancy.update_every=4",
    "model.net.field.encoding.n_levels=4",
    "model.net.field.encoding.log2_hashmap_size=12",
    "model.net.field.encoding.max_resolution=64",
    "model.net.renderer.max_samples_per_ray=32",
    "model.net.renderer.step_size=0.054",
    "model.save_val_images=false",
]

# Variables by which a launcher tells a process its place; the tests set their own.
LAUNCHER_VARS = (
    "NERF_LIGHTNING_RUN_ID",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
)
LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "PET_")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any launcher's variables, CPU only, this source tree."""
    env = {
        k: v for k, v in child_env().items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    return env


@pytest.fixture
def launcher_free_env(monkeypatch: pytest.MonkeyPatch):
    """This process's environment without launcher variables (the tests add the ones they fake).

    Restores the whole environment and Lightning's process-wide rank afterwards: Lightning writes both
    as a side effect (``MASTER_ADDR`` from the SLURM node list, ``rank_zero_only.rank`` of a Trainer
    built for rank 5), which would change what later tests see.
    """
    from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero
    from lightning.pytorch.utilities.rank_zero import rank_zero_only as pl_rank_zero
    from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero

    saved_env = dict(os.environ)
    for fn in {fabric_rank_zero, pl_rank_zero, utils_rank_zero}:
        monkeypatch.setattr(fn, "rank", getattr(fn, "rank", 0), raising=False)
    for key in list(os.environ):
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            del os.environ[key]
    yield
    os.environ.clear()
    os.environ.update(saved_env)


def tool(name: str) -> str | None:
    """An executable installed with this Python's packages (``.venv/bin``, not always on PATH), or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="package")
def tiny_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scaling") / "scene"
    generate_scene(out, n_views=12, width=32, height=32, supersample=1)
    return out
