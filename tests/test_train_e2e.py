"""End to end: `train()` on a small generated scene learns (PSNR rises by a real margin), writes outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.train import train

TINY = [
    "data.batch_size=1024",
    "data.steps_per_epoch=60",
    "model.grid_resolution=32",
    "model.grid_warmup_steps=16",
    "model.field.encoding.n_levels=8",
    "model.field.encoding.log2_hashmap_size=14",
    "model.field.encoding.max_resolution=256",
    "model.step_size=0.0135",
    "model.max_samples_per_ray=128",
    "trainer.check_val_every_n_epoch=1000",
    "callbacks.progress_bar=null",
    "accelerator=cpu",
    "logger=csv",
]


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scene") / "tiny"
    generate_scene(out, n_views=24, width=40, height=40, supersample=2)
    return out


@pytest.mark.slow
def test_training_raises_psnr_and_writes_run_outputs(scene: Path, compose_cfg, tmp_path: Path) -> None:
    torch.set_num_threads(2)
    untrained = train(compose_cfg(f"data.path={scene}", "trainer.max_steps=0", *TINY))
    cfg = compose_cfg(f"data.path={scene}", "trainer.max_steps=120", *TINY)
    metrics = train(cfg)

    assert metrics["steps"] == 120
    assert metrics["val/psnr"] > untrained["val/psnr"] + 6.0, (untrained["val/psnr"], metrics["val/psnr"])
    assert metrics["val/psnr"] > 17.0
    assert 0.0 < metrics["val/ssim"] <= 1.0
    assert metrics["train/rays_per_s"] > 0 and metrics["train/samples_per_s"] > metrics["train/rays_per_s"]
    run_dir = Path(cfg.paths.output_dir)
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["val/psnr"] == pytest.approx(metrics["val/psnr"])
    # held-out PSNR is the mean of the per-view PSNRs listed next to it; no test split: final = val
    per_view = written["val/per_view"]
    assert per_view["image"] == ["0000.png", "0008.png", "0016.png"]
    assert written["val/psnr"] == pytest.approx(sum(per_view["psnr"]) / 3, abs=1e-4)
    assert written["eval/split"] == "val" and written["eval/psnr"] == pytest.approx(written["val/psnr"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((run_dir / "val").glob("*.png")), "validation render missing"

    # The checkpoint restores the trained field: same held-out PSNR after reloading into a fresh module.
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 120
    assert any(k.startswith("field.encoding.params") for k in ckpt["state_dict"])
