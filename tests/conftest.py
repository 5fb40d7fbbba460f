"""Shared fixtures: Hydra config composition against the package's conf/."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import nerf_lightning

CONF_DIR = Path(nerf_lightning.__file__).parent / "conf"
REPO_ROOT = Path(__file__).resolve().parents[1]
FOX_DIR = REPO_ROOT.parent / "shared" / "data" / "fox"


def compose_train_config(overrides: list[str], output_dir: Path) -> DictConfig:
    """The config `python -m nerf_lightning.train <overrides>` runs, outputs in ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.runtime.cwd = str(output_dir)
            cfg.hydra.job.num = 0
        HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def compose_cfg(tmp_path: Path):
    def _compose(*overrides: str) -> DictConfig:
        return compose_train_config(list(overrides), tmp_path)

    yield _compose
    GlobalHydra.instance().clear()
