"""NeRFModule as a container: deep copies own their state, ``.to()`` moves every tensor and keeps its
dtype, the state dict round-trips into a fresh module that then renders the same image."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from nerf_lightning.models.field import NGPField
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.render.occupancy import OccupancyGrid
from nerf_lightning.render.renderer import build_renderer


def _tiny_module(seed: int) -> NeRFModule:
    torch.manual_seed(seed)
    return NeRFModule(
        field=functools.partial(
            NGPField,
            encoding=dict(n_levels=4, log2_hashmap_size=10, max_resolution=64, backend="torch"),
            hidden_dim=16,
            density_bias=1.0,
        ),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        renderer=functools.partial(
            build_renderer, occupancy=functools.partial(OccupancyGrid, resolution=16), step_size=1 / 32,
            ops_backend="torch",
        ),
        aabb_scale=2,
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
    before = _render(fresh)["rgb"]
    fresh.load_state_dict(trained.state_dict())
    a, b = _render(trained), _render(fresh)
    assert not torch.allclose(before, a["rgb"])  # the fresh module really was different
    for k in ("rgb", "depth", "opacity", "n_samples"):
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(fresh.occupancy.binaries, trained.occupancy.binaries)


def test_deep_copy_owns_parameters_and_buffers() -> None:
    module = _trained_like(0)
    clone = copy.deepcopy(module)
    reference = {k: v.clone() for k, v in module.state_dict().items()}
    image = _render(module)["rgb"]
    with torch.no_grad():
        for v in clone.state_dict().values():
            v.zero_() if v.dtype == torch.bool else v.add_(1)
    for k, v in module.state_dict().items():
        assert torch.equal(v, reference[k]), f"editing the copy changed the original's {k}"
    assert torch.equal(_render(module)["rgb"], image)


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


def test_mlp_weight_decay_pulls_only_the_mlp_matrices() -> None:
    # With every gradient zero, only coupled L2 moves a parameter: Adam's first step moves each decayed
    # entry by lr (its normalized gradient wd * p has magnitude 1 after bias correction) towards 0.
    module = _tiny_module(0)
    module.hparams.mlp_weight_decay = 1e-6
    module.optimizer_factory = functools.partial(torch.optim.Adam, lr=1e-2, eps=1e-15)
    groups = module.parameter_groups()
    assert [g.get("weight_decay", 0.0) for g in groups] == [0.0, 1e-6]
    linears = [m for m in module.field.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 5  # density: 2 layers; colour: 3
    assert {id(p) for p in groups[1]["params"]} == {id(m.weight) for m in linears}
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    optimizer = module.configure_optimizers()["optimizer"]
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in module.named_parameters():
        moved = (p.detach() - before[name]).abs()
        if name.endswith("weight") and "mlp" in name:
            nonzero = before[name] != 0
            lr_steps = torch.full_like(moved[nonzero], 1e-2)
            torch.testing.assert_close(moved[nonzero], lr_steps, rtol=1e-3, atol=0)
            step = p.detach() - before[name]
            assert (step[nonzero] * before[name][nonzero] < 0).all()  # towards 0
        else:  # the hash table and every bias
            assert torch.equal(moved, torch.zeros_like(moved)), name
    module.hparams.mlp_weight_decay = 0.0
    assert len(module.parameter_groups()) == 1


def test_power_betas_reach_the_optimizer_and_survive_a_restored_state() -> None:
    """Under ``data.beta_scaling=power`` with a global batch of 4 reference batches the optimizer runs
    with 0.9^4 / 0.99^4, also after loading an optimizer state saved with the configured betas (a
    checkpoint of one GPU): the state brings its own betas back, and the start of training rescales."""
    import types

    from nerf_lightning.models.clock import TrainingClock

    clock = TrainingClock("linear_lr", 4, overrides=(None, None, "power"))
    clock.bind(1, max_steps=100)
    module = _tiny_module(0)
    module.clock = clock
    module.optimizer_factory = functools.partial(torch.optim.Adam, lr=1e-2, betas=(0.9, 0.99))
    optimizer = module.configure_optimizers()["optimizer"]
    expected = pytest.approx((0.6561, 0.96059601), abs=1e-12)
    assert [g["betas"] for g in optimizer.param_groups] == [expected]
    saved = torch.optim.Adam(module.parameters(), lr=1e-2, betas=(0.9, 0.99)).state_dict()
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.99)
    module._trainer = types.SimpleNamespace(optimizers=[optimizer])
    module.on_train_start()
    assert [g["betas"] for g in optimizer.param_groups] == [expected]


@pytest.mark.parametrize("decay", [0.0, 1e-6])
def test_mlp_lr_scaling_gives_the_mlps_their_own_batch_factor(decay: float) -> None:
    """``linear_lr`` at 4 reference batches, ``data.mlp_lr_scaling=sqrt``, no warm-up: the hash table
    steps at 1e-2 x 4, every MLP parameter (weights and biases, decayed or not) at 1e-2 x sqrt(4);
    the decay schedule (flat over the first half) multiplies both alike."""
    from nerf_lightning.models.clock import TrainingClock
    from nerf_lightning.models.schedules import ngp_exponential_decay

    clock = TrainingClock("linear_lr", 4, lr_warmup=0, mlp_lr_scaling="sqrt")
    clock.bind(1, max_steps=400)
    module = _tiny_module(0)
    module.clock = clock
    module.hparams.mlp_weight_decay = decay
    module.optimizer_factory = functools.partial(torch.optim.Adam, lr=1e-2)
    module.scheduler_factory = ngp_exponential_decay
    optimizer = module.configure_optimizers()["optimizer"]
    linears = [m for m in module.field.modules() if isinstance(m, torch.nn.Linear)]
    mlp = {id(p) for m in linears for p in m.parameters()}
    table = {id(p) for p in module.field.encoding.parameters()}
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    assert table and sorted({lr_of[i] for i in table}) == pytest.approx([4e-2])
    assert sorted({lr_of[i] for i in mlp}) == pytest.approx([2e-2])
    assert len(lr_of) == len(list(module.parameters()))  # every parameter in exactly one group
    decays = {id(p): g.get("weight_decay", 0.0) for g in optimizer.param_groups for p in g["params"]}
    assert {decays[id(m.weight)] for m in linears} == {decay}
    assert {decays[id(m.bias)] for m in linears} | {decays[i] for i in table} == {0.0}
    # without the key, one group for the field (two with weight decay), every parameter at x 4
    module.clock = TrainingClock("linear_lr", 4, lr_warmup=0)
    module.clock.bind(1, max_steps=400)
    optimizer = module.configure_optimizers()["optimizer"]
    assert len(optimizer.param_groups) == (2 if decay else 1)
    assert sorted({g["lr"] for g in optimizer.param_groups}) == pytest.approx([4e-2])


def test_large_batch_moves_the_learning_rate_decay_to_70_percent_of_the_run() -> None:
    """``large_batch`` at 4 reference batches, 1000 reference steps (250 optimizer steps), no warm-up:
    instant-ngp's decay (x 0.33) from 700 reference steps every 100, not the configured 500 every 150.
    After s optimizer steps the schedule reads position 4 s: the table's rate is 4e-2 through s = 174
    (position 696), 4e-2 x 0.33 from s = 175 (position 700), 4e-2 x 0.33^2 from s = 200 (position 800);
    the MLPs' is half of it. The configured decay would have started at s = 125 (position 500)."""
    from nerf_lightning.models.clock import TrainingClock
    from nerf_lightning.models.schedules import ngp_exponential_decay

    module = _tiny_module(0)
    module.clock = TrainingClock("large_batch", 4, lr_warmup=0)
    module.clock.bind(1, max_steps=1000)
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
    module.clock = TrainingClock("large_batch", 1, lr_warmup=0)
    module.clock.bind(1, max_steps=1000)
    conf = module.configure_optimizers()
    optimizer, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    for _ in range(500):
        optimizer.step()
        scheduler.step()
    assert {round(g["lr"], 12) for g in optimizer.param_groups} == {round(1e-2 * 0.33, 12)}


@pytest.mark.parametrize(("grid_unit", "steps"), [(None, [16, 32]), ("rays", list(range(4, 33, 4)))])
def test_the_occupancy_grid_updates_on_its_own_unit(grid_unit: str | None, steps: list[int]) -> None:
    """At 4 reference batches a step under ``per_device_rays`` the grid (update every 16) updates every
    16 optimizer steps, as one GPU's run (the rules in rays keep the grid in steps), or with
    ``data.grid_unit=rays`` every 4; each update is given its position in the grid's unit (which its
    warm-up is compared with)."""
    import types

    from nerf_lightning.models.clock import TrainingClock

    clock = TrainingClock("per_device_rays", 4, overrides=(None, None, None, grid_unit))
    clock.bind(1, max_steps=1000)
    module = _tiny_module(0)
    module.clock = clock
    assert module.occupancy.update_every == 16
    updates: list[tuple[int, float]] = []
    trainer = types.SimpleNamespace(
        accumulate_grad_batches=1, world_size=1, global_rank=0, global_step=0, strategy=None
    )
    module._trainer = trainer
    module.occupancy.update = lambda step, density_fn, share: updates.append((trainer.global_step, step))
    for step in range(1, 33):
        trainer.global_step = step
        module.on_train_batch_end(None, None, step - 1)
    assert updates == [(s, 4.0 * s if grid_unit == "rays" else float(s)) for s in steps]
