"""Our file loggers: TensorBoard images (the CSV logger's resume is covered by tests/run/test_resume.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from nerf_lightning.tracking.loggers import TensorBoardLogger


def test_tensorboard_logger_logs_images(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="")
    image = torch.zeros(4, 8, 3, dtype=torch.uint8)
    image[:, 4:] = 255
    logger.log_image(key="val/panel", images=[image.numpy()], step=3)
    logger.finalize("success")
    acc = EventAccumulator(str(Path(logger.log_dir))).Reload()
    (event,) = acc.Images("val/panel")
    assert (event.step, event.width, event.height) == (3, 8, 4)
