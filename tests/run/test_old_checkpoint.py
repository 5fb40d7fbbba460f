"""A checkpoint written before issue 65 (commit 336a14e: flat loss keys, the model's parts as nodes of
``model``) loads in today's tree and renders the very pixels that tree rendered from it.

The fixture (``fixtures/old_checkpoint/``) and how it was made: ``fixtures/make_old_checkpoint.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nerf_lightning.run.restore import load_run
from tests.run.fixtures.make_old_checkpoint import fixed_rays

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"


def test_an_old_checkpoint_renders_the_pixels_its_tree_rendered() -> None:
    model = load_run(FIXTURE / "last.ckpt").build_model()  # strict: every state-dict key as written
    want = np.load(FIXTURE / "render.npz")
    o, d = fixed_rays()
    with torch.inference_mode():
        out = model.renderer.render_image(model.field, o, d, torch.tensor([1.0, 1.0, 1.0]), chunk=64)
    assert float(want["rgb"].std()) > 0.01  # the fixture renders a scene, not the background alone
    for key in ("rgb", "depth", "opacity"):
        assert np.abs(out[key].numpy() - want[key]).max() == 0.0, key
    assert {k.split(".")[0] for k in model.state_dict()} == {"field", "renderer", "camera_opt", "appearance"}
