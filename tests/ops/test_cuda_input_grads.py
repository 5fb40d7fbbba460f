"""The CUDA ops' gradients w.r.t. their inputs (learned camera poses move the sample positions and turn
the view directions): each equals the PyTorch reference's autograd, and is computed only when asked
for. GPU only: ``pytest -m cuda``."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.ops import reference as ref
from nerf_lightning.ops.reference import hash_encode as hash_encode_torch
from nerf_lightning.ops.reference import sh_encode as sh_encode_torch
from nerf_lightning.ops.registry import as_backend

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda as cu  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def extension_loaded():
    from nerf_lightning.ops import _ext

    assert cu.is_available(), f"the CUDA extension did not load: {_ext.error()}"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("features", [1, 2, 4, 8])
def test_hash_encoding_position_gradient_equals_the_reference(table_dtype, features) -> None:
    torch.manual_seed(features)
    enc = HashEncoding(n_levels=12, n_features_per_level=features, log2_hashmap_size=15, max_resolution=1024)
    table = (torch.randn_like(enc.params) * 0.5).to(DEV, table_dtype)
    x = (torch.rand(50_000, 3, device=DEV) * 0.98 + 0.01).requires_grad_()
    g = torch.randn(50_000, enc.n_output_dims, device=DEV)
    g[:100] = 0.0  # a zero upstream gradient: the kernel skips those rows
    args = (enc.scales, enc.resolutions, enc.offsets)
    (want,) = torch.autograd.grad((hash_encode_torch(x, table.float(), *args) * g).sum(), x)
    out = cu.hash_encode(x, table, *args)
    (got,) = torch.autograd.grad((out * g).sum(), x)
    assert float(want.abs().max()) > 1.0
    assert _rel(got, want) < (1e-5 if table_dtype == torch.float32 else 1e-3)
    assert torch.equal(got[:100], torch.zeros_like(got[:100]))


def test_hash_encoding_without_a_position_gradient_saves_no_table() -> None:
    """The default run (no learned poses): positions do not require grad, the backward computes the
    table gradient only (the position kernel is never launched)."""
    enc = HashEncoding(n_levels=4, log2_hashmap_size=12, max_resolution=64).to(DEV)
    out = cu.hash_encode(
        torch.rand(1000, 3, device=DEV), enc.params, enc.scales, enc.resolutions, enc.offsets
    )
    xf, table = out.grad_fn.saved_tensors
    assert table is None and xf.shape == (1000, 3)


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_sh_direction_gradient_equals_the_reference(degree) -> None:
    torch.manual_seed(degree)
    d = torch.nn.functional.normalize(torch.randn(100_000, 3, device=DEV), dim=-1).requires_grad_()
    g = torch.randn(100_000, degree * degree, device=DEV)
    out = cu.sh_encode(d, degree)
    torch.testing.assert_close(out, sh_encode_torch(d, degree), rtol=0, atol=1e-6)
    got = torch.autograd.grad((out * g).sum(), d, allow_unused=True)[0] if out.requires_grad else None
    if degree == 1:  # a constant has no direction gradient (the reference's graph does not reach d)
        assert got is None or torch.equal(got, torch.zeros_like(got))
    else:
        (want,) = torch.autograd.grad((sh_encode_torch(d, degree) * g).sum(), d)
        assert _rel(got, want) < 1e-6


def test_sample_points_ray_gradient_equals_the_reference() -> None:
    torch.manual_seed(0)
    n_rays, n = 3000, 200_000
    o = torch.randn(n_rays, 3, device=DEV, requires_grad=True)
    d = torch.nn.functional.normalize(torch.randn(n_rays, 3, device=DEV), dim=-1).requires_grad_()
    idx = torch.sort(torch.randint(0, n_rays, (n,), device=DEV)).values
    t0 = torch.rand(n, device=DEV) * 2
    t1 = t0 + torch.rand(n, device=DEV) * 0.01
    gp, gd = torch.randn(n, 3, device=DEV), torch.randn(n, 3, device=DEV)
    outs = []
    for fn in (cu.sample_points, ref.sample_points):
        p, dirs = fn(o, d, idx, t0, t1)
        outs.append((p.detach(), torch.autograd.grad((p * gp).sum() + (dirs * gd).sum(), (o, d))))
    (p_c, (go_c, gd_c)), (p_r, (go_r, gd_r)) = outs
    assert torch.equal(p_c, p_r)  # same forward kernel as without gradients: bit-equal
    assert _rel(go_c, go_r) < 1e-6 and _rel(gd_c, gd_r) < 1e-6
    # positions only (the directions' output unused): still the rays' full gradient
    p, _ = cu.sample_points(o, d, idx, t0, t1)
    go, gdir = torch.autograd.grad((p * gp).sum(), (o, d))
    p_r, _ = ref.sample_points(o, d, idx, t0, t1)
    go_r, gdir_r = torch.autograd.grad((p_r * gp).sum(), (o, d))
    assert _rel(go, go_r) < 1e-6 and _rel(gdir, gdir_r) < 1e-6


def test_normalize_to_box_position_gradient_equals_the_reference() -> None:
    torch.manual_seed(1)
    p = (torch.rand(100_000, 3, device=DEV) * 3.0 - 1.0).requires_grad_()  # a third outside the box
    box_min, box_size = torch.full((3,), -0.5, device=DEV), torch.full((3,), 2.0, device=DEV)
    g = torch.randn(100_000, 3, device=DEV)
    outs = []
    for fn in (cu.normalize_to_box, ref.normalize_to_box):
        x, inside = fn(p, box_min, box_size)
        outs.append((x.detach(), inside, torch.autograd.grad((x * g).sum(), p)[0]))
    (x_c, in_c, g_c), (x_r, in_r, g_r) = outs
    assert torch.equal(x_c, x_r) and torch.equal(in_c, in_r)
    assert not in_r.all() and in_r.any()
    torch.testing.assert_close(g_c, g_r, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_mlp_gradient_of_the_second_input_equals_the_reference(dtype) -> None:
    """The colour network's second input (the SH of the view directions): its gradient as accurate
    as the half-precision reference's, both against float64; asked for, it is a fourth result."""
    g = torch.Generator(device=DEV).manual_seed(3)
    n, c0, c1 = 50_003, 16, 16
    in0 = torch.randn(n, c0, device=DEV, generator=g)
    in1 = torch.randn(n, c1, device=DEV, generator=g)
    weights, biases, width = [], [], c0 + c1
    for out in (64, 64, 3):
        weights.append(torch.randn(out, width, device=DEV, generator=g) / width**0.5)
        biases.append(torch.randn(out, device=DEV, generator=g) * 0.1)
        width = out
    g_out = torch.randn(n, 3, device=DEV, generator=g)

    def grads(fn, cast):
        a, b = in0.clone().to(cast).requires_grad_(), in1.clone().to(cast).requires_grad_()
        w = [t.to(cast) for t in weights]
        bb = [t.to(cast) for t in biases]
        out = fn(a, b, w, bb)
        out.backward(g_out.to(out.dtype))
        return a.grad.double(), b.grad.double()

    def exact(a, b, w, bb):
        x = torch.cat([a, b], dim=-1)
        for i, (wi, bi) in enumerate(zip(w, bb, strict=True)):
            x = x @ wi.t() + bi
            x = torch.relu(x) if i + 1 < len(w) else x
        return x

    truth = grads(exact, torch.float64)
    reference = grads(lambda *a: ref.fused_mlp(*a, dtype), torch.float32)
    kernel = grads(lambda *a: cu.fused_mlp(*a, dtype), torch.float32)
    for name, k, r, t in zip(("in0", "in1"), kernel, reference, truth, strict=True):
        err_ref, err = _rel(r, t), _rel(k, t)
        assert err < 2.0 * err_ref + 1e-4 and err < 0.1, (name, err, err_ref)
    from nerf_lightning.ops.cuda import _support

    args = (g_out, in0, in1, weights, biases, dtype == torch.bfloat16, True)
    assert len(_support.ext().fused_mlp_bwd(*args)) == 3  # the three-result form is unchanged
    assert len(_support.ext().fused_mlp_bwd(*args, True)) == 4


def test_budgeted_render_ray_gradients_cuda_equal_reference() -> None:
    """The whole differentiable pass (positions, directions, field, compositing) w.r.t. the rays, as
    the pose corrections see it: the CUDA backend's gradient equals the reference backend's."""
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer, SampleBudget

    torch.manual_seed(0)
    field = NGPField(aabb_scale=1, density_bias=1.0).to(DEV)
    with torch.no_grad():
        field.encoding.params.uniform_(-0.5, 0.5)
    grid = OccupancyGrid(aabb_scale=1, resolution=64).to(DEV)
    g = torch.Generator(device=DEV).manual_seed(1)
    o = torch.nn.functional.normalize(torch.randn(4096, 3, device=DEV, generator=g), dim=-1) * 1.5 + 0.5
    target = 0.5 + (torch.rand(4096, 3, device=DEV, generator=g) - 0.5) * 0.8
    d = torch.nn.functional.normalize(target - o, dim=-1)
    bg = torch.rand(4096, 3, device=DEV, generator=g)
    up = torch.rand(4096, 3, device=DEV, generator=g)
    results = []
    for backend in ("cuda", "torch"):
        field.encoding.backend = as_backend(backend)
        ro, rd = o.clone().requires_grad_(), d.clone().requires_grad_()
        out = Renderer(grid, backend=backend).render_rays(
            field, ro, rd, bg, jitter=False, budget=SampleBudget(1 << 19, 1 << 17)
        )
        loss = (out.rgb * up * out.ray_valid[:, None]).sum()
        results.append(torch.autograd.grad(loss, (ro, rd)))
    (go_c, gd_c), (go_r, gd_r) = results
    assert float(go_r.norm()) > 0 and float(gd_r.norm()) > 0
    assert _rel(go_c, go_r) < 1e-3 and _rel(gd_c, gd_r) < 1e-3
