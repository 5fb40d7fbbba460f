"""Compose the training config outside ``@hydra.main`` (benchmarks, tests, notebooks)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from nerf_lightning.run.run_dir import register_resolvers

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_train_config(
    overrides: list[str], output_dir: str | Path, cwd: str | Path | None = None
) -> DictConfig:
    """The config ``python -m nerf_lightning.train <overrides>`` would run, writing into ``output_dir``.

    ``cwd`` stands for the launch directory (``paths.root_dir``: scene and image caches); default
    ``output_dir``. Registers the config as the current Hydra config so ``${hydra:...}`` resolves.
    """
    return compose_app_config("train", overrides, output_dir, cwd)


def compose_app_config(
    config_name: str, overrides: list[str], output_dir: str | Path, cwd: str | Path | None = None
) -> DictConfig:
    """Like :func:`compose_train_config` for any app (``train``, ``eval``, ``render``, ``export``)."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.runtime.cwd = str(cwd if cwd is not None else output_dir)
            cfg.hydra.job.num = 0
        HydraConfig.instance().set_config(cfg)
    return cfg
