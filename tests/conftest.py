"""Shared fixtures: Hydra config composition against the package's conf/."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from nerf_lightning.utils.config import CONF_DIR, compose_train_config

__all__ = ["CONF_DIR", "compose_train_config"]
REPO_ROOT = Path(__file__).resolve().parents[1]
FOX_DIR = REPO_ROOT.parent / "shared" / "data" / "fox"


@pytest.fixture
def compose_cfg(tmp_path: Path):
    def _compose(*overrides: str) -> DictConfig:
        return compose_train_config(list(overrides), tmp_path)

    yield _compose
    GlobalHydra.instance().clear()
