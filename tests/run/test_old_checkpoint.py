"""A checkpoint written before issue 65 (commit 336a14e: flat loss keys, the model's parts as nodes of
``model``) loads in today's tree and renders the very pixels that tree rendered from it.

The fixture (``fixtures/old_checkpoint/``) and how it was made: ``fixtures/make_old_checkpoint.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from hydra.core.global_hydra import GlobalHydra

from nerf_lightning.run.config import compose_train_config
from nerf_lightning.run.restore import load_run, upgrade_model_keys
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


def test_an_old_checkpoint_s_loss_keys_and_per_view_parts_arrive() -> None:
    """The old flat loss keys (``make_old_checkpoint.OLD_KEYS``) land in ``model.net.loss``, the old nodes in
    ``model.net``: the rebuilt module runs with the loss and the parts the run trained with."""
    run = load_run(FIXTURE / "last.ckpt")
    assert run.config.model.net.loss.huber_delta == 0.2 and "huber_delta" not in run.config.model
    model = run.build_model()
    trained = ("huber", 0.2, 0.01, 0.05)
    loss = model.step_loss
    assert (loss.kind, loss.huber_delta, loss.distortion_weight, loss.alpha_weight) == trained
    step = model.train_step_fn
    assert (step.loss, step.huber_delta, step.distortion_weight, step.alpha_weight) == trained
    assert model.camera_opt is not None and model.appearance is not None
    assert step.camera_opt is model.camera_opt and step.appearance is model.appearance
    assert not step.budgeted  # the CPU preset's sample_budget: null, from the old model.step node


def test_old_loss_keys_on_the_command_line(tmp_path: Path) -> None:
    cfg = compose_train_config(
        ["model.huber_delta=0.2", "model.loss=mse", "model.alpha_weight=auto", "model.jitter=false"], tmp_path
    )
    GlobalHydra.instance().clear()
    loss = cfg.model.net.loss
    assert (loss.kind, loss.huber_delta, loss.alpha_weight) == ("mse", 0.2, "auto")
    assert cfg.model.net.step.jitter is False


def test_an_old_node_moves_before_the_old_keys_that_land_in_it() -> None:
    """``model.step`` (a node) and ``model.jitter`` (now ``model.net.step.jitter``) of one old config: the
    node moves whole, then the key lands in it, whatever their order in the file."""
    target = "nerf_lightning.models.train_step.train_step"
    old_step = {"_target_": target, "_partial_": True, "sample_budget": None}
    for model in ({"jitter": False, "step": old_step}, {"step": old_step, "jitter": False}):
        upgraded = upgrade_model_keys({"model": {"huber_delta": 0.3, **model}})["model"]
        assert upgraded["net"]["step"] == {**old_step, "jitter": False}
        assert upgraded["net"]["loss"]["huber_delta"] == 0.3 and upgraded["net"]["loss"]["kind"] == "huber"
        assert upgraded["net"]["field"]["_target_"] == "nerf_lightning.models.field.NGPField"  # ngp.yaml's
        assert not {"step", "jitter", "huber_delta"} & set(upgraded)
