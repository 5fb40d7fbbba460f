"""Hydra entry point: compose the config, instantiate everything, fit, validate, write metrics.json.

    python -m nerf_lightning.train [overrides]
    python -m nerf_lightning.train data.path=../shared/data/fox data.downscale=4
    python -m nerf_lightning.train strategy=ddp devices=4 precision=bf16-mixed
    python -m nerf_lightning.train -m model.field.encoding.log2_hashmap_size=15,17,19

Returns the value of ``optimized_metric`` (val/psnr) so Hydra sweepers can optimize it.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.models.metrics import final_evaluation
from nerf_lightning.utils.checkpoint_io import AtomicCheckpointIO
from nerf_lightning.utils.io import atomic_write_json
from nerf_lightning.utils.tracking import finish_loggers

log = logging.getLogger("nerf_lightning.train")

# Known-harmless noise: our step loader is an IterableDataset with __len__ (no workers), and a
# deprecation inside Lightning's own pytree helper.
warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a dict-of-configs group (callbacks, loggers)."""
    if not group:
        return []
    return [
        hydra.utils.instantiate(node) for node in group.values() if node is not None and "_target_" in node
    ]


def _resolve_ckpt(ckpt_path: str | None, output_dir: Path) -> str | None:
    if ckpt_path == "last":
        last = output_dir / "checkpoints" / "last.ckpt"
        return str(last) if last.exists() else None
    return ckpt_path


def train(cfg: DictConfig) -> dict[str, float]:
    """Run one training job described by ``cfg``; returns the final metrics (also in metrics.json)."""
    output_dir = Path(cfg.paths.output_dir)
    L.seed_everything(cfg.seed, workers=True)

    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    # The model's box (aabb_scale) comes from the capture, so read the capture first.
    datamodule.prepare_data()
    datamodule.setup("fit")
    model: L.LightningModule = hydra.utils.instantiate(cfg.model, aabb_scale=datamodule.aabb_scale)

    callbacks = instantiate_group(cfg.get("callbacks"))
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()]
    )
    metrics: dict[str, float] = {}
    exit_code = 1
    try:  # a W&B run is closed even when training fails, so the next multirun job gets its own run
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))  # the resolved Hydra config

        start = time.perf_counter()
        trainer.fit(model, datamodule=datamodule, ckpt_path=_resolve_ckpt(cfg.get("ckpt_path"), output_dir))
        wall_s = time.perf_counter() - start
        results = trainer.validate(model, datamodule=datamodule, verbose=False)

        metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
        # per-view numbers, and the final evaluation on the test split when the capture has one
        metrics.update(final_evaluation(trainer, model, datamodule))
        for cb in callbacks:
            summary = getattr(cb, "summary", None)
            if callable(summary):
                metrics.update(summary())
        metrics.setdefault("steps", trainer.global_step)
        metrics["time/wall_s"] = wall_s
        metrics["model/occupied_fraction"] = float(model.occupancy.occupied_fraction())
        exit_code = 0
    finally:
        finish_loggers(loggers, metrics, exit_code=exit_code)
    if trainer.is_global_zero:
        atomic_write_json(output_dir / "metrics.json", metrics)
        log.info(
            "val/psnr %.2f dB  val/ssim %.4f  final evaluation (%s): %.2f dB  (%d steps, %.0f s training)",
            metrics.get("val/psnr", float("nan")),
            metrics.get("val/ssim", float("nan")),
            metrics.get("eval/split", "?"),
            metrics.get("eval/psnr", float("nan")),
            metrics["steps"],
            metrics.get("time/train_s", metrics["time/wall_s"]),
        )
        print(f"val/psnr: {metrics.get('val/psnr', float('nan')):.2f} dB")
        if metrics.get("eval/split") == "test":
            print(f"test/psnr: {metrics.get('test/psnr', float('nan')):.2f} dB")
        print(f"run dir: {output_dir}")
    return metrics


_NUMERIC_GROUP_CHOICE = re.compile(r"^(\+{0,2}precision)=(\d+)$")
# `model.encoding.*` (the and instant-ngp's spelling) is the field's encoding config.
_ENCODING_ALIAS = re.compile(r"^([+~]{0,2})model\.encoding\.")


def normalize_overrides(argv: list[str]) -> list[str]:
    """Quote numeric choices of the ``precision`` group (``precision=32``): Hydra would parse an int.
    Accept ``model.encoding.<key>`` for ``model.field.encoding.<key>``."""
    argv = [_ENCODING_ALIAS.sub(r"\1model.field.encoding.", arg) for arg in argv]
    return [_NUMERIC_GROUP_CHOICE.sub(r"\1='\2'", arg) for arg in argv]


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    if cfg.get("print_config", False):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    torch.set_float32_matmul_precision("high")
    metrics = train(cfg)
    value = metrics.get(cfg.get("optimized_metric") or "")
    return float(value) if value is not None else None


def with_device_preset(argv: list[str], has_cuda: bool) -> list[str]:
    """Add ``experiment=cpu`` when there is no CUDA GPU and the user picked no experiment.

    instant-ngp's defaults assume a GPU; on a CPU they would take hours. The CPU preset keeps the
    same scene and pipeline with a smaller grid and coarser marching. ``experiment=null`` opts out.
    """
    if has_cuda or any(a.lstrip("+~").startswith(("experiment=", "hparams_search=")) for a in argv):
        return argv
    if any(a in ("--help", "-h", "--hydra-help", "--info") for a in argv):
        return argv
    print(
        "[nerf_lightning] no CUDA GPU: using the CPU preset (experiment=cpu) (experiment=null: off)",
        file=sys.stderr,
    )
    return [*argv, "experiment=cpu"]  # after the user's args: before `-m` Hydra would reject them


def main() -> None:
    argv = normalize_overrides(sys.argv[1:])
    sys.argv = [sys.argv[0], *with_device_preset(argv, torch.cuda.is_available())]
    _hydra_main()


if __name__ == "__main__":
    main()
