"""NeRFModule as a container: deep copies own their state, ``.to()`` moves every tensor and keeps its
dtype, the state dict round-trips into a fresh module that then renders the same image."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from nerf_lightning.models.field import NGPField
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import build_renderer
from tests.nerf_modules import nerf_module


def _tiny_module(seed: int) -> NeRFModule:
    torch.manual_seed(seed)
    return nerf_module(
        field=functools.partial(
            NGPField,
            encoding=dict(n_levels=4, log2_hashmap_size=10, max_resolution=64),
            hidden_dim=16,
            density_bias=1.0,
        ),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        renderer=functools.partial(
            build_renderer, occupancy=functools.partial(OccupancyGrid, resolution=16), step_size=1 / 32,
        ),
        aabb_scale=2,
        backend="torch",
    )


def _trained_like(seed: int) -> NeRFModule:
    """A module whose parameters and occupancy grid are not their initial values."""
    module = _tiny_module(seed)
    with torch.no_grad():
        module.field.encoding.params.uniform_(-0.5, 0.5)
    module.occupancy.update(0, module.field.density, generator=torch.Generator().manual_seed(seed))
    assert 0.0 < module.occupancy.occupied_fraction() < 1.0
    return module


def _render(module: NeRFModule) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    o = torch.rand(48, 3, generator=g) * torch.tensor([1.0, 1.0, 0.0]) + torch.tensor([0.0, 0.0, -0.6])
    d = torch.nn.functional.normalize(
        torch.tensor([0.0, 0.0, 1.0]) + 0.3 * torch.randn(48, 3, generator=g), dim=-1
    )
    with torch.no_grad():
        return module.renderer.render_rays(module.field, o, d, torch.ones(3), jitter=False)


def test_state_dict_round_trip_renders_the_same_image() -> None:
    trained = _trained_like(0)
    fresh = _tiny_module(1)
    before = _render(fresh).rgb
    fresh.load_state_dict(trained.state_dict())
    a, b = _render(trained), _render(fresh)
    assert not torch.allclose(before, a.rgb)  # the fresh module really was different
    for k in ("rgb", "depth", "opacity", "n_samples"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert torch.equal(fresh.occupancy.binaries, trained.occupancy.binaries)


def test_deep_copy_owns_parameters_and_buffers() -> None:
    module = _trained_like(0)
    clone = copy.deepcopy(module)
    reference = {k: v.clone() for k, v in module.state_dict().items()}
    image = _render(module).rgb
    with torch.no_grad():
        for v in clone.state_dict().values():
            v.zero_() if v.dtype == torch.bool else v.add_(1)
    for k, v in module.state_dict().items():
        assert torch.equal(v, reference[k]), f"editing the copy changed the original's {k}"
    assert torch.equal(_render(module).rgb, image)


def test_to_moves_every_tensor_and_keeps_dtypes() -> None:
    """The meta device stands in for a GPU: no tensor attribute of any submodule stays behind (a
    stale CPU tensor would fail on the first CUDA step) and no dtype changes on the way."""
    module = _tiny_module(0)
    dtypes = {k: v.dtype for k, v in module.state_dict(keep_vars=True).items()}
    dtypes.update({f"buffer:{k}": v.dtype for k, v in module.named_buffers()})
    module.to("meta")
    after = {k: v.dtype for k, v in module.state_dict(keep_vars=True).items()}
    after.update({f"buffer:{k}": v.dtype for k, v in module.named_buffers()})
    assert after == dtypes
    assert dtypes["renderer.occupancy.density_grid"] == torch.float32
    assert dtypes["renderer.occupancy.binaries"] == torch.bool
    stale = []
    for name, sub in module.named_modules():
        for attr, value in vars(sub).items():
            tensors = value.values() if isinstance(value, dict) else [value]
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    stale.append(f"{name}.{attr}")
    assert not stale, f"tensors left on the CPU by .to(): {stale}"


def _clock_of(rule_changes: dict, max_steps: int = 1000):
    """A bound clock of one process drawing ``rank_multiple`` reference batches (what N GPUs draw)."""
    from dataclasses import replace

    from nerf_lightning.training.batch_rules import large_batch
    from nerf_lightning.training.clock import TrainingClock

    clock = TrainingClock(replace(large_batch(), **rule_changes))
    clock.bind(1, max_steps=max_steps)
    return clock


def test_large_batch_gives_the_table_and_the_mlps_their_own_factor() -> None:
    """``large_batch`` at 4 reference batches, no warm-up: the hash table steps at 1e-2 x 4, every MLP
    parameter (weights and biases) at 1e-2 x sqrt(4); at 1 reference batch both at 1e-2, in the same two
    groups (the optimizer state's layout does not depend on the rule or the world size)."""
    module = _tiny_module(0)
    module.clock = _clock_of({"rank_multiple": 4, "lr_warmup": 0}, max_steps=400)
    module.optimizer_factory = functools.partial(torch.optim.Adam, lr=1e-2)
    optimizer = module.configure_optimizers()["optimizer"]
    linears = [m for m in module.field.modules() if isinstance(m, torch.nn.Linear)]
    mlp = {id(p) for m in linears for p in m.parameters()}
    table = {id(p) for p in module.field.encoding.parameters()}
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert table and sorted({lr_of[i] for i in table}) == pytest.approx([4e-2])
    assert sorted({lr_of[i] for i in mlp}) == pytest.approx([2e-2])
    assert len(lr_of) == len(list(module.parameters()))  # every parameter in exactly one group
    assert [g["lr_part"] for g in optimizer.param_groups] == ["table", "mlp"]
    module.clock = _clock_of({"lr_warmup": 0}, max_steps=400)
    optimizer = module.configure_optimizers()["optimizer"]
    assert [g["lr_part"] for g in optimizer.param_groups] == ["table", "mlp"]
    assert {g["lr"] for g in optimizer.param_groups} == {1e-2}


def test_large_batch_moves_the_learning_rate_decay_to_70_percent_of_the_run() -> None:
    """``large_batch`` at 4 reference batches, 1000 reference steps (250 optimizer steps), no warm-up:
    instant-ngp's decay (x 0.33) from 700 reference steps every 100, not the configured 500 every 150.
    After s optimizer steps the schedule reads position 4 s: the table's rate is 4e-2 through s = 174
    (position 696), 4e-2 x 0.33 from s = 175 (position 700), 4e-2 x 0.33^2 from s = 200 (position 800);
    the MLPs' is half of it. The configured decay would have started at s = 125 (position 500)."""
    from nerf_lightning.training.lr_schedules import ngp_exponential_decay

    module = _tiny_module(0)
    module.clock = _clock_of({"rank_multiple": 4, "lr_warmup": 0})
    module.optimizer_factory = functools.partial(torch.optim.Adam, lr=1e-2)
    module.scheduler_factory = functools.partial(ngp_exponential_decay, decay_start=0.5, decay_interval=0.15)
    conf = module.configure_optimizers()
    optimizer, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    mlp = [g.get("lr_part") == "mlp" for g in optimizer.param_groups]
    assert sorted(set(mlp)) == [False, True]
    seen = {}
    for step in range(1, 230):
        seen[step] = [g["lr"] for g in optimizer.param_groups]
        optimizer.step()
        scheduler.step()
    table = mlp.index(False)
    expected = {130: 4e-2, 174: 4e-2, 175: 4e-2 * 0.33, 199: 4e-2 * 0.33, 200: 4e-2 * 0.33**2}
    for step, lr in expected.items():
        assert seen[step + 1][table] == pytest.approx(lr), step  # seen[s + 1]: the rate after s steps
        assert seen[step + 1][mlp.index(True)] == pytest.approx(lr / 2), step
    # one GPU with the configured batch keeps the configured decay (from 500 every 150)
    module.clock = _clock_of({"lr_warmup": 0})
    conf = module.configure_optimizers()
    optimizer, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    for _ in range(500):
        optimizer.step()
        scheduler.step()
    assert {round(g["lr"], 12) for g in optimizer.param_groups} == {round(1e-2 * 0.33, 12)}


def test_the_occupancy_grid_keeps_its_cadence_in_optimizer_steps() -> None:
    """At 4 reference batches a step under ``large_batch`` (schedules in rays) the grid (update every 16)
    updates every 16 optimizer steps, as one GPU's run does, each update given its optimizer step."""
    import types

    module = _tiny_module(0)
    module.clock = _clock_of({"rank_multiple": 4})
    assert module.occupancy.update_every == 16 and module.clock.rate == 4
    updates: list[tuple[int, float]] = []
    trainer = types.SimpleNamespace(
        accumulate_grad_batches=1, world_size=1, global_rank=0, global_step=0, strategy=None
    )
    module._trainer = trainer
    module.occupancy.update = lambda step, density_fn, share: updates.append((trainer.global_step, step))
    for step in range(1, 33):
        trainer.global_step = step
        module.on_train_batch_end(None, None, step - 1)
    assert updates == [(16, 16), (32, 32)]
