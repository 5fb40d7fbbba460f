"""The budgeted (static-shape) training path on the GPU: kernels equal the reference, the step is
free of host syncs, and its CUDA-graph replay equals eager execution. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import math

import pytest
import torch

from nerf_lightning.ops import reference as ref
from nerf_lightning.ops.registry import as_backend

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.models.field import NGPField  # noqa: E402
from nerf_lightning.models.loss import StepLoss  # noqa: E402
from nerf_lightning.models.train_step import TrainStep, capture  # noqa: E402
from nerf_lightning.ops import cuda as cu  # noqa: E402
from nerf_lightning.volume.occupancy import OccupancyGrid  # noqa: E402
from nerf_lightning.volume.renderer import Renderer, SampleBudget  # noqa: E402
from tests.ray_batches import ray_batch  # noqa: E402

DEV = torch.device("cuda")


def _rays(n: int, gen: torch.Generator):
    o = torch.nn.functional.normalize(torch.randn(n, 3, device=DEV, generator=gen), dim=-1) * 1.5 + 0.5
    target = 0.5 + (torch.rand(n, 3, device=DEV, generator=gen) - 0.5) * 0.8
    return o.contiguous(), torch.nn.functional.normalize(target - o, dim=-1).contiguous()


def _binaries(gen: torch.Generator, c: int = 1, g: int = 64) -> torch.Tensor:
    ax = (torch.arange(g, device=DEV) + 0.5) / g - 0.5
    r = torch.sqrt(ax[:, None, None] ** 2 + ax[None, :, None] ** 2 + ax[None, None, :] ** 2)
    bins = ((r > 0.15) & (r < 0.3))[None].expand(c, g, g, g).clone()
    return bins | (torch.rand(c, g, g, g, generator=gen, device=DEV) > 0.97)


def _marching_inputs(n: int, seed: int):
    """(generator, origins, directions, t_near, t_far, occupancy bitfield) of ``n`` rays into the unit box."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    o, d = _rays(n, gen)
    bins = _binaries(gen)
    tn, tf, _ = ref.ray_aabb_intersect(o, d, torch.tensor([0.0, 0, 0, 1, 1, 1], device=DEV))
    return gen, o, d, tn, tf, bins


@pytest.mark.parametrize("n_active", [None, 700])
@pytest.mark.parametrize("fraction", [0.3, 2.0])
def test_march_rays_fixed_equals_reference(n_active, fraction):
    gen, o, d, tn, tf, bins = _marching_inputs(2000, seed=3)
    jit = torch.rand(2000, device=DEV, generator=gen)
    total = int(ref.march_rays(o, d, tn, tf, bins, t_jitter=jit).packed_info[:, 1].sum())
    cap = int(total * fraction)
    act = None if n_active is None else torch.tensor(n_active, device=DEV)
    for _ in range(2):  # poisoned allocator: every slot must be written (samples or padding zeros)
        blocks = [torch.full((1 << k,), float("nan"), device=DEV) for k in (16, 20, 22)]
        del blocks
        got, valid_c = cu.march_rays_fixed(o, d, tn, tf, bins, capacity=cap, n_active=act, t_jitter=jit)
    want, valid_r = ref.march_rays_fixed(o, d, tn, tf, bins, capacity=cap, n_active=act, t_jitter=jit)
    assert torch.equal(valid_c, valid_r)
    assert torch.equal(got.packed_info, want.packed_info)
    assert torch.equal(got.ray_indices, want.ray_indices)
    torch.testing.assert_close(got.t_starts, want.t_starts, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.t_ends, want.t_ends, rtol=0, atol=1e-5)
    assert not torch.isnan(got.t_starts).any()
    if fraction < 1:
        assert not valid_c.all() and valid_c.any()


def _scene(seed: int = 0, aabb_scale: int = 1):
    torch.manual_seed(seed)
    field = NGPField(aabb_scale=aabb_scale, density_bias=1.0).to(DEV)
    with torch.no_grad():
        field.encoding.params.uniform_(-0.5, 0.5)
    gen = torch.Generator(device=DEV).manual_seed(seed + 1)
    grid = OccupancyGrid(aabb_scale=aabb_scale, resolution=64).to(DEV)
    grid.binaries.copy_(_binaries(gen, grid.n_cascades))
    o, d = _rays(4096, gen)
    bg = torch.rand(4096, 3, device=DEV, generator=gen)
    target = torch.rand(4096, 3, device=DEV, generator=gen)
    return field, grid, o, d, bg, target


def test_budgeted_render_cuda_equals_reference():
    field, grid, o, d, bg, _ = _scene()
    outs = []
    for backend in ("cuda", "torch"):
        field.encoding.backend = as_backend(backend)
        field.zero_grad(set_to_none=True)
        r = Renderer(grid, backend=backend)
        out = r.render_rays(
            field, o, d, bg, jitter=False, budget=SampleBudget(1 << 19, 1 << 17)
        )
        (out.rgb * out.ray_valid[:, None]).square().sum().backward()
        outs.append((out, [p.grad.clone() for p in field.parameters()]))
    (oc, gc), (orf, gr) = outs
    assert torch.equal(oc.ray_valid, orf.ray_valid) and 0 < int(oc.ray_valid.sum()) < 4096
    torch.testing.assert_close(oc.rgb, orf.rgb, rtol=1e-4, atol=1e-4)
    for a, b in zip(gc, gr, strict=True):
        assert float((a - b).norm() / b.norm().clamp_min(1e-12)) < 1e-3


def _step(field, grid, jitter=False, distortion_weight=0.0):
    renderer = Renderer(grid, backend="cuda")
    return TrainStep(
        field, renderer, StepLoss("huber", 0.1, distortion_weight=distortion_weight), sample_budget=1 << 16,
        march_budget=1 << 18, n_rays_init=2048, jitter=jitter,
    ).to(DEV)  # fmt: skip


def test_budget_step_and_occupancy_update_never_sync_with_the_host():
    field, grid, o, d, bg, target = _scene()
    step = _step(field, grid, jitter=True)
    opt = torch.optim.Adam(field.parameters(), lr=1e-2, eps=1e-15, fused=True)
    loss, *_ = step(ray_batch(o, d, target, bg))  # first call: extension load, cuBLAS handles
    loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(3):
            loss, per_ray, valid, stats = step(ray_batch(o, d, target, bg))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            grid.update(300 + 16 * i, field.density, warmup_steps=256)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize(("alias", "share"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_graph_replay_equals_eager_steps(precision, alias, share):
    """Three optimizer steps replayed from the captured graphs equal three eager steps, whether
    ``.grad`` aliases the graph's gradient buffers (zeroed by set_to_none) or accumulates them, and
    with the inputs shared (updated in place between replays, as the batch graph does) or copied."""
    results = []
    for graphed in (False, True):
        field, grid, o, d, bg, target = _scene(seed=4)
        o0 = o.clone()
        step = _step(field, grid)
        opt = torch.optim.Adam(field.parameters(), lr=1e-2, eps=1e-15, fused=True)
        fn = step
        if graphed:
            batch = ray_batch(o, d, target, bg)
            fn = capture(step, batch, precision, alias_gradients=alias, share_inputs=share)
        losses = []
        for i in range(3):
            if share:
                o.copy_(o0 + 0.001 * i)  # the same buffer, new values
            rays_o = o if share else o0 + 0.001 * i
            ctx = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
            with ctx if precision == "bf16-mixed" else torch.autocast("cuda", enabled=False):
                loss, per_ray, valid, stats = fn(ray_batch(rays_o, d, target, bg))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=alias)
            losses.append(float(loss))
            if i == 1:  # occupancy changes between replays must be seen by the graph
                grid.binaries[:, :32] = False
        results.append((losses, [p.detach().clone() for p in field.parameters()], stats.clone()))
    (l_e, p_e, s_e), (l_g, p_g, s_g) = results
    assert l_g == pytest.approx(l_e, rel=2e-3)
    assert torch.equal(s_e[:3], s_g[:3])  # same rays and samples
    for a, b in zip(p_g, p_e, strict=True):
        assert float((a - b).norm() / b.norm().clamp_min(1e-12)) < 5e-3


def _no_reference_distortion(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the budgeted step ran ops.reference.distortion_loss on CUDA tensors")

    monkeypatch.setattr(ref, "distortion_loss", fail)


def test_budget_step_with_distortion_runs_the_kernel_without_host_syncs(monkeypatch):
    _no_reference_distortion(monkeypatch)
    field, grid, o, d, bg, target = _scene()
    step = _step(field, grid, jitter=True, distortion_weight=0.01)
    opt = torch.optim.Adam(field.parameters(), lr=1e-2, eps=1e-15, fused=True)
    loss, *_ = step(ray_batch(o, d, target, bg))
    loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            loss, per_ray, valid, stats = step(ray_batch(o, d, target, bg))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_budgeted_render_distortion_cuda_equals_reference():
    """On a real fixed-layout render (compaction, terminated samples of weight 0, padding slots, rays
    dropped as invalid): the kernel's loss and its gradient w.r.t. the weights equal the reference's."""
    from nerf_lightning.volume.renderer import ray_distortion

    field, grid, o, d, bg, _ = _scene(seed=3)
    r = Renderer(grid, backend="cuda")
    out = r.render_rays(field, o, d, bg, jitter=False, budget=SampleBudget(1 << 19, 1 << 16))
    n_used = int(out.packed_info[:, 1].sum())
    assert n_used <= out.weights.shape[0] and not bool(out.ray_valid.all())
    up = torch.rand(o.shape[0], device=DEV) + 0.1
    results = []
    for ops in (cu, ref):
        dist = ray_distortion(out, ops)
        (g_w,) = torch.autograd.grad((dist * up).sum(), out.weights, retain_graph=True)
        results.append((dist.detach(), g_w))
    (dc, gc), (dr, gr) = results
    assert float(dc.max()) > 0
    torch.testing.assert_close(dc, dr, rtol=2e-6, atol=1e-9)
    torch.testing.assert_close(gc, gr, rtol=1e-5, atol=1e-6 * float(gr.abs().max()))
    assert (gc[n_used:] == 0).all()


def test_graph_replay_with_distortion_equals_eager_steps(monkeypatch):
    _no_reference_distortion(monkeypatch)
    results = []
    for graphed in (False, True):
        field, grid, o, d, bg, target = _scene(seed=4)
        step = _step(field, grid, distortion_weight=0.01)
        opt = torch.optim.Adam(field.parameters(), lr=1e-2, eps=1e-15, fused=True)
        fn = capture(step, ray_batch(o, d, target, bg), "32-true") if graphed else step
        losses = []
        for i in range(3):
            loss, per_ray, valid, stats = fn(ray_batch(o + 0.001 * i, d, target, bg))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        results.append((losses, [p.detach().clone() for p in field.parameters()], stats.clone()))
    (l_e, p_e, s_e), (l_g, p_g, s_g) = results
    assert l_g == pytest.approx(l_e, rel=2e-3)
    assert torch.equal(s_e[:3], s_g[:3])
    for a, b in zip(p_g, p_e, strict=True):
        assert float((a - b).norm() / b.norm().clamp_min(1e-12)) < 5e-3


def test_graph_replay_accumulates_gradients_over_micro_batches():
    field, grid, o, d, bg, target = _scene(seed=6)
    step = _step(field, grid)
    fn = capture(step, ray_batch(o, d, target, bg), "32-true", alias_gradients=False)
    for p in field.parameters():
        p.grad.zero_()
    fn(ray_batch(o, d, target, bg))[0].backward()
    once = [p.grad.clone() for p in field.parameters()]
    fn(ray_batch(o, d, target, bg))[0].backward()
    for p, g in zip(field.parameters(), once, strict=True):
        torch.testing.assert_close(p.grad, 2 * g, rtol=1e-4, atol=1e-8)
    assert math.isfinite(sum(float(g.norm()) for g in once))


@pytest.mark.parametrize("fraction", [0.0, 0.4, 1.5])
@pytest.mark.parametrize("layout", ["dynamic", "fixed"])
def test_repack_cuda_equals_reference(fraction, layout):
    gen, o, d, tn, tf, bins = _marching_inputs(3000, seed=11)
    if layout == "dynamic":
        packed = ref.march_rays(o, d, tn, tf, bins)
        ray_valid = torch.rand(3000, device=DEV, generator=gen) < 0.9
    else:  # the training step's input: a fixed layout with padding and dropped rays
        total = int(ref.march_rays(o, d, tn, tf, bins).packed_info[:, 1].sum())
        packed, ray_valid = ref.march_rays_fixed(o, d, tn, tf, bins, capacity=int(0.8 * total) + 100)
    keep = torch.rand(packed.t_starts.shape[0], device=DEV, generator=gen) < 0.6
    cap = int(int(keep.sum()) * fraction)
    got, valid_c = cu.repack(packed, keep, cap, ray_valid)
    want, valid_r = ref.repack(packed, keep, cap, ray_valid)
    assert torch.equal(valid_c, valid_r)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    if 0 < fraction < 1:
        assert valid_c.any() and not valid_c[ray_valid].all()
