"""With corrections on, a run recovers the known damage of ``data/synthetic/damage.py`` (CPU budgets;
``repro``: about a minute each on 2 cores)."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from models.tiny_training import train_tiny, validate
from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.data.synthetic.damage import damage_gains, damage_poses
from nerf_lightning.models.appearance import PerViewExposure
from nerf_lightning.models.camera_opt import CameraOptimizer

pytestmark = pytest.mark.repro
STEPS = 300


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_scene(
        tmp_path_factory.mktemp("r") / "s", n_views=24, width=32, height=32, supersample=2
    ).parent


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(a @ b.T) - 1) / 2))))


def test_learned_poses_undo_most_of_a_known_pose_damage(scene: Path, tmp_path: Path) -> None:
    path = damage_poses(scene, tmp_path / "poses", seed=0)
    cam = functools.partial(CameraOptimizer, enabled=True, lr=3e-3, lr_final=3e-4, decay_steps=1.0)
    model, dm = train_tiny(path, STEPS, camera_opt=cam)
    truth = [f.c2w[:3, :3] for f in load_capture(scene).train]
    given = dm.train_poses.double().numpy()[:, :, :3]
    refined = model.camera_opt.refined_poses(dm.train_poses).numpy()[:, :, :3]
    before = np.mean([_angle_deg(t, g) for t, g in zip(truth, given, strict=True)])
    after = np.mean([_angle_deg(t, r) for t, r in zip(truth, refined, strict=True)])
    print(f"rotation error: {before:.3f} -> {after:.3f} deg")
    assert 1.0 <= before <= 2.0
    # 300 CPU steps at 32 px: 1.45 -> 0.91 degrees (2026-12-05, 2-core CPU). The fifth is not met
    # by any pose-group setting tried: docs/investigations/2026-12-05-learned-poses.md
    assert after < 0.75 * before, (before, after)


def test_learned_exposure_recovers_known_gains_up_to_their_mean(scene: Path, tmp_path: Path) -> None:
    path = damage_gains(scene, tmp_path / "gains", seed=0, headroom=0.7)
    model, dm = train_tiny(path, STEPS, appearance=functools.partial(PerViewExposure, enabled=True))
    truth = np.array([f["gain"] for f in json.loads((path / "damage.json").read_text())["frames"]])
    truth /= np.exp(np.log(truth).mean(0))  # the gauge: the learned gains have geometric mean 1
    learned = model.appearance.gains().detach().numpy()
    error = np.abs(learned / truth - 1)
    print(f"gain error: mean {error.mean():.4f} max {error.max():.4f}")
    assert error.mean() < 0.05, error.mean()  # the target at full budgets: 3 %
    fitted = validate(model, path)
    assert "val/psnr_fitted" in fitted
