"""End to end: `train()` on a small generated scene learns (PSNR rises by a real margin), writes outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import TINY

from nerf_lightning.train import train


@pytest.mark.slow
def test_training_raises_psnr_and_writes_run_outputs(
    tiny_scene: Path, trained_run: tuple[Path, dict[str, float]], compose_cfg
) -> None:
    torch.set_num_threads(2)
    untrained = train(compose_cfg(f"data.path={tiny_scene}", "trainer.max_steps=0", *TINY))
    run_dir, metrics = trained_run

    assert metrics["steps"] == 120
    assert metrics["val/psnr"] > untrained["val/psnr"] + 6.0, (untrained["val/psnr"], metrics["val/psnr"])
    assert metrics["val/psnr"] > 17.0
    assert 0.0 < metrics["val/ssim"] <= 1.0
    assert metrics["train/rays_per_s"] > 0 and metrics["train/samples_per_s"] > metrics["train/rays_per_s"]
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["val/psnr"] == pytest.approx(metrics["val/psnr"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((run_dir / "val").glob("*.png")), "validation render missing"

    # The checkpoint restores the trained field: same held-out PSNR after reloading into a fresh module.
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 120
    assert any(k.startswith("field.encoding.params") for k in ckpt["state_dict"])
