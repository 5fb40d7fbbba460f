"""One key, ``model.net.backend``, chooses the ops of the whole training step; one ``model.cuda_graph``.

``build_nerf`` (the ``model.net`` node) reads ``model.net.backend`` once into an ``ops.Backend`` and hands
it to the field (hash and SH encodings, MLPs) and the renderer (marching, compositing, occupancy grid, the
step's loss kernels). The old keys that each covered part of the step are read as the new one, on the
command line and in a checkpoint's stored config (of the layout before ``model.net`` and of the one with
the three keys under ``model.net``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from ray_batches import ray_batch
from runs import fork_app

import nerf_lightning.models.encoding as encoding_module
from nerf_lightning.apps.train import build_datamodule
from nerf_lightning.errors import EXIT_USER_ERROR
from nerf_lightning.ops import OP_NAMES, Backend, reference, registry
from nerf_lightning.run.checkpoint_callbacks import CHECKPOINT_KEY
from nerf_lightning.run.config import compose_train_config
from nerf_lightning.run.model_node import instantiate_model
from nerf_lightning.run.restore import load_run, upgrade_moved_keys

#: a small CPU model (the CPU preset, smaller still)
SMALL = [
    "experiment=cpu",
    "model.net.field.encoding.n_levels=4",
    "model.net.field.encoding.log2_hashmap_size=10",
    "model.net.field.encoding.max_resolution=64",
    "model.net.renderer.occupancy.resolution=16",
]
#: ops one training step runs: the field's, the renderer's and the step's loss
STEP_OPS = {
    "normalize_to_box", "density_activation", "sh_encode", "ray_aabb_intersect", "march_rays",
    "sample_points", "volume_render", "masked_ray_loss",
}  # fmt: skip


def _model(tmp_path: Path, *overrides: str) -> torch.nn.Module:
    cfg = compose_train_config([*SMALL, *overrides], tmp_path)
    try:
        return instantiate_model(cfg.model, {"aabb_scale": 1})
    finally:
        GlobalHydra.instance().clear()


def _rays(n: int = 64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    o = torch.rand(n, 3, generator=g) * 0.2 + torch.tensor([0.4, 0.4, -0.5])
    d = torch.nn.functional.normalize(
        torch.tensor([0.0, 0.0, 1.0]) + 0.1 * torch.randn(n, 3, generator=g), dim=-1
    )
    return o, d, torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g)


def _recorded(op: Callable[..., Any], name: str, calls: list[str]) -> Callable[..., Any]:
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return op(*args, **kwargs)

    return spy


@pytest.mark.filterwarnings("ignore:ops backend 'cuda' requested:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:model.net.backend=cuda:RuntimeWarning")
@pytest.mark.parametrize(("backend", "fuses_mlp"), [("torch", False), ("cuda", True), ("auto", True)])
def test_model_backend_reaches_every_op_of_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, fuses_mlp: bool
) -> None:
    module = _model(tmp_path, f"model.net.backend={backend}")
    one = module.field.backend
    assert one == Backend(backend)
    holders = [module.field, module.field.encoding, module.field.direction_encoding, module.renderer]
    assert all(m.backend is one for m in holders) and module.occupancy._ops is one
    assert module.field.backend.fuses_mlp is fuses_mlp

    asked: list[str] = []  # every namespace an op of the step is looked up in, by name
    get_ops = registry.get_ops
    monkeypatch.setattr(registry, "get_ops", lambda name="auto": asked.append(name) or get_ops(name))
    ran: list[str] = []  # the reference ops that ran (torch; and the CPU fallback of cuda / auto)
    via_auto: list[str] = []  # the ops called through auto's dispatcher, wherever it was looked up
    for name in OP_NAMES:
        monkeypatch.setattr(reference, name, _recorded(getattr(reference, name), name, ran))
        monkeypatch.setattr(registry._AUTO, name, _recorded(getattr(registry._AUTO, name), name, via_auto))
    fused = encoding_module.hash_encode_fused
    monkeypatch.setattr(encoding_module, "hash_encode_fused", lambda *a: ran.append("hash_grid") or fused(*a))

    loss, *_ = module.train_step_fn(ray_batch(*_rays()))
    loss.backward()
    module.occupancy.update(0, module.field.density)

    assert set(asked) == {backend}  # no component asks for a backend of its own
    assert set(via_auto) == (set(ran) - {"hash_grid"} if backend == "auto" else set())
    assert STEP_OPS | {"hash_grid", "grid_ema_update", "grid_occupancy"} <= set(ran)
    assert module.field.encoding.resolve_backend(torch.zeros(1, 3)) == "torch"  # a CPU machine: torch
    assert torch.isfinite(loss) and module.field.encoding.params.grad.abs().sum() > 0


def test_old_keys_are_read_as_the_one_backend_and_the_one_cuda_graph(tmp_path: Path) -> None:
    for old in ("model.renderer.ops_backend", "model.field.encoding.backend", "model.field.mlp_backend"):
        overrides = ["model.net.backend=auto", f"{old}=torch", "data.cuda_graph=false"]
        cfg = compose_train_config(overrides, tmp_path)
        try:
            assert cfg.model.net.backend == "torch" and cfg.model.cuda_graph is False, old
            assert "cuda_graph" not in cfg.data and "ops_backend" not in cfg.model.net.renderer
            assert build_datamodule(cfg).cuda_graph is False  # the train app hands model.cuda_graph over
            module = instantiate_model(cfg.model, {"aabb_scale": 1})
        finally:
            GlobalHydra.instance().clear()
        assert module.field.encoding.backend.name == "torch" and module.renderer.backend.name == "torch"


def _before_net(model: dict[str, Any]) -> dict[str, Any]:
    """``model`` (plain config) in the layout before ``model.net`` (336a14e's): its nodes directly under
    ``model``, the loss keys flat, ``jitter`` the module's."""
    net = {k: v for k, v in model.pop("net").items() if k not in ("_target_", "_partial_", "backend")}
    loss = {k: v for k, v in net.pop("loss").items() if k != "_target_"}
    jitter = net["step"].pop("jitter")
    return {**model, **net, "jitter": jitter, "loss": loss.pop("kind"), **loss}


@pytest.mark.parametrize("layout", ["before_net", "under_net"])
def test_a_checkpoint_with_the_three_backend_keys_restores_and_renders_the_same(
    tmp_path: Path, layout: str
) -> None:
    cfg = compose_train_config(SMALL, tmp_path)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
        model = instantiate_model(cfg.model, {"aabb_scale": 1})
    finally:
        GlobalHydra.instance().clear()
    plain.pop("hydra")
    assert plain["model"]["net"]["backend"] == "torch"  # the CPU preset's
    # the layouts before model.net.backend: three keys, and a cuda_graph under data as well as model
    if layout == "before_net":
        plain["model"] = _before_net(plain["model"])
        parts = plain["model"]
    else:
        del plain["model"]["net"]["backend"]
        parts = plain["model"]["net"]
    parts["renderer"]["ops_backend"] = "auto"
    parts["field"]["encoding"]["backend"] = "torch"
    parts["field"]["mlp_backend"] = "auto"
    plain["data"]["cuda_graph"] = False
    section = {"config": plain, "instantiate_kwargs": {"model": {"aabb_scale": 1}}}
    with torch.no_grad():
        model.field.encoding.params.uniform_(-0.5, 0.5)  # weights unlike a fresh model's
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": model.state_dict(), "global_step": 2, CHECKPOINT_KEY: section}, ckpt)

    run = load_run(ckpt)
    net = run.config.model.net
    assert net.backend == "torch"  # the one old value that is not auto
    assert "ops_backend" not in net.renderer and "backend" not in net.field.encoding
    assert "mlp_backend" not in net.field and "cuda_graph" not in run.config.data
    assert run.config.model.cuda_graph == "auto"  # today's key was there: it keeps its value
    restored = run.build_model()
    assert restored.field.backend.name == "torch" and restored.renderer.backend.name == "torch"
    o, d, _, bg = _rays()
    with torch.no_grad():
        before = model.eval().renderer.render_rays(model.field, o, d, bg, jitter=False).rgb
        after = restored.renderer.render_rays(restored.field, o, d, bg, jitter=False).rgb
    assert torch.equal(before, after) and float(before.std()) > 0


def test_the_first_old_backend_that_is_not_auto_wins() -> None:
    def old(ops: str, encoding: str, mlp: str) -> dict:
        field = {"encoding": {"backend": encoding, "n_levels": 4}, "mlp_backend": mlp}
        return {"model": {"net": {"renderer": {"ops_backend": ops}, "field": field}}}

    assert upgrade_moved_keys(old("auto", "tcnn", "auto"))["model"]["net"]["backend"] == "tcnn"
    assert upgrade_moved_keys(old("cuda", "tcnn", "torch"))["model"]["net"]["backend"] == "cuda"
    assert upgrade_moved_keys(old("auto", "auto", "torch"))["model"]["net"]["backend"] == "torch"
    upgraded = upgrade_moved_keys(old("auto", "auto", "auto"))["model"]["net"]
    assert upgraded == {"renderer": {}, "field": {"encoding": {"n_levels": 4}}, "backend": "auto"}


@pytest.mark.parametrize("key", ["model.net.backend", "model.renderer.ops_backend"])
def test_a_bad_backend_is_one_error_line_and_exit_2(tmp_path: Path, key: str) -> None:
    log, err = tmp_path / "train.out", tmp_path / "train.err"
    argv = [f"{key}=gpu", "data.path=/no/such/capture", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = fork_app("train", *argv, cwd=tmp_path, log=log, err_log=err)
    proc.join(120)
    assert proc.exitcode == EXIT_USER_ERROR, err.read_text()[-2000:]
    stderr = err.read_text()
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if "error" in line] == [
        "error: model.net.backend=gpu: expected one of auto, cuda, tcnn, torch "
        "(auto: our CUDA kernels for CUDA tensors, else torch)"
    ]
