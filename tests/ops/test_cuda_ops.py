"""CUDA ray ops equal the reference (ops/reference) on fresh random inputs. GPU only: ``pytest -m cuda``.

Outputs are poisoned before each call: the caching allocator is filled with NaN blocks and
released, so ``torch.empty`` outputs of the kernels start as NaN and any unwritten element shows.
Tolerances: box/grid/marching t values are exact float32 replays (asserted equal, marching up to
documented float-boundary ties: >= 99.9% of rays identical, t within 1e-5); compositing uses a
per-ray float64 optical depth (reference: global float64 cumsum), values within 1e-5 relative,
gradients within 1e-4 relative (closed form vs autograd).
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch

from nerf_lightning.ops import OP_NAMES, get_ops
from nerf_lightning.ops import reference as ref
from nerf_lightning.ops.registry import as_backend

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda as cu  # noqa: E402
from nerf_lightning.ops.cuda import _support  # noqa: E402

DEV = torch.device("cuda")
#: functions ``ops/cuda`` takes from the reference as they are (documented there)
REFERENCE_REUSED = set(cu.REFERENCE_OPS)


@pytest.fixture(autouse=True)
def extension_loaded():
    """Without the extension every ``cu.*`` call runs the reference, and each comparison below would
    compare the reference with itself: fail instead of passing trivially."""
    from nerf_lightning.ops import _ext

    assert cu.is_available(), f"the CUDA extension did not load: {_ext.error()}"


def poison() -> None:
    """Fill cached allocator blocks of many sizes with NaN, then free them for reuse."""
    sizes = (1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23)
    blocks = [torch.full((n,), float("nan"), device=DEV) for n in sizes]
    blocks += [torch.full((n,), 0xFF, dtype=torch.uint8, device=DEV) for n in (1 << 12, 1 << 20)]
    del blocks


def assert_all_written(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.is_floating_point():
            assert not torch.isnan(t).any(), "output element not written (NaN poison survived)"


def test_extension_builds_and_loads():
    t0 = time.perf_counter()
    from nerf_lightning.ops import _ext

    assert cu.is_available(), f"extension failed: {_ext.error()}"
    assert time.perf_counter() - t0 < 600


def random_rays(n: int, spread: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    o = (torch.rand(n, 3, generator=gen, device=DEV) - 0.5) * spread + 0.5
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=gen, device=DEV), dim=-1)
    return o, d


@pytest.mark.parametrize("n", [0, 1, 37, 100_000])
def test_ray_aabb_intersect_equal(n):
    gen = torch.Generator(device=DEV).manual_seed(n)
    o, d = random_rays(n, 6.0, gen)
    if n > 10:
        d[:5, 0] = 0.0  # axis-parallel rays: zero components must not give NaN
        d[5:8, 1:] = 0.0
        o[8] = torch.tensor([0.5, 0.5, 0.5], device=DEV)  # inside
    for scale in (1, 4, 16):
        aabb = torch.tensor([0.5 - scale / 2] * 3 + [0.5 + scale / 2] * 3, device=DEV)
        poison()
        tn, tf, hit = cu.ray_aabb_intersect(o, d, aabb)
        rn, rf, rh = ref.ray_aabb_intersect(o, d, aabb)
        assert_all_written(tn, tf)
        assert torch.equal(hit, rh)
        assert torch.equal(tn, rn) and torch.equal(tf, rf)
        if n > 10 and scale == 1:  # (the scale-16 box contains every origin)
            assert 0 < hit.sum() < n and (tn[~hit] == 1e10).all() and (tf[~hit] == 1e10).all()


def test_grid_helpers_equal():
    gen = torch.Generator(device=DEV).manual_seed(3)
    for c, g in ((1, 32), (5, 64), (8, 16)):
        n = 200_000
        idx = torch.randint(0, c * g**3, (n,), generator=gen, device=DEV)
        jit = torch.rand(n, 3, generator=gen, device=DEV)
        poison()
        p = cu.grid_cell_positions(idx, jit, g)
        assert_all_written(p)
        assert torch.equal(p, ref.grid_cell_positions(idx, jit, g))
        grid = torch.rand(c, g**3, generator=gen, device=DEV) * 10
        grid[:, :g] = -1.0  # never-seen cells stay negative
        dens = torch.rand(n, generator=gen, device=DEV) * 20
        dens[:100] = 0.0
        poison()
        new = cu.grid_ema_update(grid, idx, dens, 0.95)
        assert_all_written(new)
        assert torch.equal(new, ref.grid_ema_update(grid, idx, dens, 0.95))
        assert (new[:, :g] == -1).all()
        bins = torch.rand(c, g, g, g, generator=gen, device=DEV) > 0.7
        poison()
        bits = cu.pack_bitfield(bins)
        assert bits.dtype == torch.uint8 and torch.equal(bits, ref.pack_bitfield(bins))
        back = cu.unpack_bitfield(bits, c, g)
        assert torch.equal(back, bins) and torch.equal(back, ref.unpack_bitfield(bits, c, g))


def make_binaries(c: int, g: int, gen: torch.Generator) -> torch.Tensor:
    """Blobs (sphere shells per cascade) plus random cells: runs of empty and occupied space."""
    ax = (torch.arange(g, device=DEV) + 0.5) / g - 0.5
    r = torch.sqrt(ax[:, None, None] ** 2 + ax[None, :, None] ** 2 + ax[None, None, :] ** 2)
    shell = (r > 0.15) & (r < 0.3)
    bins = shell[None].expand(c, g, g, g).clone()
    bins |= torch.rand(c, g, g, g, generator=gen, device=DEV) > 0.97
    return bins


def compare_packed(a, b, n_rays: int) -> None:
    """>= 99.9% of rays with identical samples; t values within 1e-5 on those."""
    ca, cb = a.packed_info[:, 1], b.packed_info[:, 1]
    assert a.ray_indices.dtype == torch.long and a.t_starts.dtype == torch.float32
    assert a.packed_info.shape == (n_rays, 2)
    if n_rays == 0:
        return
    same_count = ca == cb
    assert same_count.float().mean() >= 0.999, f"{(~same_count).sum()} rays differ in sample count"
    # Compare samples of rays with equal counts.
    ma = same_count[a.ray_indices] if a.ray_indices.numel() else a.ray_indices.bool()
    mb = same_count[b.ray_indices] if b.ray_indices.numel() else b.ray_indices.bool()
    assert torch.equal(a.ray_indices[ma], b.ray_indices[mb])
    ts_a, ts_b = a.t_starts[ma], b.t_starts[mb]
    te_a, te_b = a.t_ends[ma], b.t_ends[mb]
    close = ((ts_a - ts_b).abs() <= 1e-5) & ((te_a - te_b).abs() <= 1e-5)
    assert close.all()
    exact = (ts_a == ts_b) & (te_a == te_b)
    assert exact.float().mean() >= 0.999 if exact.numel() else True
    # packed layout consistent
    assert torch.equal(a.packed_info[:, 0], torch.cumsum(ca, 0) - ca)


@pytest.mark.parametrize("aabb_scale", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("cone", [0.0, 1 / 256])
def test_march_rays_equal(aabb_scale, cone):
    gen = torch.Generator(device=DEV).manual_seed(aabb_scale * 7 + int(cone > 0))
    c = int(math.log2(aabb_scale)) + 1
    g = 64
    bins = make_binaries(c, g, gen)
    n = 3000 if (cone > 0 or aabb_scale <= 4) else 600
    o, d = random_rays(n, 2.0 * aabb_scale, gen)
    box = torch.tensor([0.5 - aabb_scale / 2] * 3 + [0.5 + aabb_scale / 2] * 3, device=DEV)
    tn, tf, hit = ref.ray_aabb_intersect(o, d, box)
    assert (~hit).any() and hit.any()  # rays that miss are part of the test
    jitter = torch.rand(n, generator=gen, device=DEV)
    for kw in (
        dict(),
        dict(t_jitter=jitter, near_plane=0.05),
        dict(max_samples_per_ray=7),
    ):
        step = math.sqrt(3) / 1024 * (4 if aabb_scale >= 8 and cone == 0 else 1)
        poison()
        got = cu.march_rays(o, d, tn, tf, bins, step_size=step, cone_angle=cone, **kw)
        want = ref.march_rays(o, d, tn, tf, bins, step_size=step, cone_angle=cone, **kw)
        assert_all_written(got.t_starts, got.t_ends)
        assert got.ray_indices.numel() > 0
        compare_packed(got, want, n)
        if "max_samples_per_ray" in kw:
            assert got.packed_info[:, 1].max() <= 7


def test_march_rays_edge_cases():
    gen = torch.Generator(device=DEV).manual_seed(5)
    bins = make_binaries(2, 32, gen)
    o, d = random_rays(0, 1.0, gen)
    empty = cu.march_rays(o, d, o[:, 0], o[:, 0], bins)
    assert empty.ray_indices.shape == (0,) and empty.packed_info.shape == (0, 2)
    # all rays miss the box
    o = torch.full((50, 3), 10.0, device=DEV)
    d = torch.tensor([[1.0, 0.0, 0.0]], device=DEV).expand(50, 3).contiguous()
    box = torch.tensor([-0.5, -0.5, -0.5, 1.5, 1.5, 1.5], device=DEV)
    tn, tf, hit = cu.ray_aabb_intersect(o, d, box)
    assert not hit.any()
    s = cu.march_rays(o, d, tn, tf, bins)
    assert s.ray_indices.numel() == 0 and (s.packed_info == 0).all()
    # empty grid -> no samples; cap 0 -> no samples
    o, d = random_rays(100, 1.0, gen)
    tn, tf, _ = cu.ray_aabb_intersect(o, d, box)
    assert cu.march_rays(o, d, tn, tf, torch.zeros_like(bins)).t_starts.numel() == 0
    assert cu.march_rays(o, d, tn, tf, bins, max_samples_per_ray=0).t_starts.numel() == 0


def random_packed(n_rays: int, gen: torch.Generator, max_per_ray: int = 64):
    counts = torch.randint(0, max_per_ray, (n_rays,), generator=gen, device=DEV)
    if n_rays > 3:
        counts[:3] = 0
    s = int(counts.sum())
    ray_idx = torch.repeat_interleave(torch.arange(n_rays, device=DEV), counts)
    dt = torch.rand(s, generator=gen, device=DEV) * 0.02 + 1e-3
    starts_of_ray = torch.cumsum(counts, 0) - counts
    csum = torch.cumsum(dt, 0)
    base = torch.zeros(n_rays, device=DEV)
    nz = counts > 0
    base[nz] = (csum - dt)[starts_of_ray[nz]]
    t_s = (csum - dt) - base[ray_idx] + 0.1
    t_e = t_s + dt
    info = torch.stack([starts_of_ray, counts], -1)
    # densities spanning transparent to opaque (opaque rays trigger early termination)
    sig = torch.rand(s, generator=gen, device=DEV) ** 3 * 400.0
    return sig, t_s, t_e, ray_idx, info


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


@pytest.mark.parametrize("n_rays", [0, 1, 500, 20_000])
@pytest.mark.parametrize("with_info", [True, False])
def test_render_weights_equal(n_rays, with_info):
    gen = torch.Generator(device=DEV).manual_seed(n_rays + 11)
    sig, t_s, t_e, ray_idx, info = random_packed(n_rays, gen)
    gw = torch.randn(sig.shape, generator=gen, device=DEV)
    gt = torch.randn(sig.shape, generator=gen, device=DEV)
    outs, grads = [], []
    for mod in (cu, ref):
        s = sig.clone().requires_grad_(True)
        poison()
        w, trans = mod.render_weights(s, t_s, t_e, ray_idx, n_rays, info if with_info else None)
        assert_all_written(w, trans)
        ((w * gw).sum() + (trans * gt).sum()).backward()
        outs.append((w.detach(), trans.detach()))
        grads.append(s.grad)
    (w_c, t_c), (w_r, t_r) = outs
    torch.testing.assert_close(w_c, w_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_c, t_r, rtol=1e-5, atol=1e-6)
    if sig.numel():
        assert (w_r == 0).any() and (t_r < 1e-4).any()  # early termination was exercised
        assert rel_err(grads[0], grads[1]) < 1e-4


@pytest.mark.parametrize("n_rays", [0, 3, 4096])
@pytest.mark.parametrize("background", [None, "vec", "rays"])
@pytest.mark.parametrize("max_per_ray", [64, 700])
@pytest.mark.parametrize("used", [("rgb", "opacity", "depth", "weights"), ("rgb",)])
def test_volume_render_equal(n_rays, background, max_per_ray, used):
    """Outputs and gradients; ``used``: the outputs the loss reads (training reads only ``rgb``: the
    kernels then get no opacity/depth gradient and composite the background themselves)."""
    gen = torch.Generator(device=DEV).manual_seed(n_rays * 3 + 1)
    sig, t_s, t_e, ray_idx, info = random_packed(n_rays, gen, max_per_ray)
    if max_per_ray > 64:
        sig = sig * 0.02  # long, mostly transparent rays: many 32-sample chunks before termination
    rgbs = torch.rand(sig.shape[0], 3, generator=gen, device=DEV)
    bg = {None: None, "vec": torch.rand(3, device=DEV), "rays": torch.rand(n_rays, 3, device=DEV)}[background]
    g = {
        k: torch.randn(shape, generator=gen, device=DEV)
        for k, shape in (
            ("rgb", (n_rays, 3)),
            ("opacity", (n_rays, 1)),
            ("depth", (n_rays, 1)),
            ("weights", sig.shape),
        )
    }
    results = []
    for mod in (cu, ref):
        s = sig.clone().requires_grad_(True)
        c = rgbs.clone().requires_grad_(True)
        poison()
        out = mod.volume_render(s, c, t_s, t_e, ray_idx, n_rays, info, background=bg)
        assert_all_written(*out.values())
        sum(((out[k] * g[k]).sum() for k in used), torch.zeros((), device=DEV)).backward()
        results.append(({k: v.detach() for k, v in out.items()}, s.grad, c.grad))
    (oc, gs_c, gc_c), (orf, gs_r, gc_r) = results
    for k in ("rgb", "opacity", "depth", "weights"):
        torch.testing.assert_close(oc[k], orf[k], rtol=1e-5, atol=1e-5)
    if sig.numel():
        assert rel_err(gs_c, gs_r) < 1e-4
        assert rel_err(gc_c, gc_r) < 1e-5


def test_volume_render_background_that_needs_a_gradient():
    gen = torch.Generator(device=DEV).manual_seed(5)
    sig, t_s, t_e, ray_idx, info = random_packed(500, gen)
    rgbs = torch.rand(sig.shape[0], 3, generator=gen, device=DEV)
    grads = []
    for mod in (cu, ref):
        bg = torch.rand(500, 3, generator=torch.Generator(device=DEV).manual_seed(1), device=DEV)
        bg.requires_grad_(True)
        out = mod.volume_render(sig, rgbs, t_s, t_e, ray_idx, 500, info, background=bg)
        out["rgb"].square().sum().backward()
        grads.append(bg.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    assert float(grads[0].abs().sum()) > 0


def test_volume_render_autocast_and_no_weight_grad():
    gen = torch.Generator(device=DEV).manual_seed(9)
    sig, t_s, t_e, ray_idx, info = random_packed(300, gen)
    rgbs = torch.rand(sig.shape[0], 3, generator=gen, device=DEV)
    for dtype in (torch.float16, torch.bfloat16):
        s = sig.to(dtype).requires_grad_(True)
        c = rgbs.to(dtype).requires_grad_(True)
        with torch.autocast("cuda", dtype=dtype):
            out = cu.volume_render(s, c, t_s, t_e, ray_idx, 300, info)
            assert out["rgb"].dtype == torch.float32
            out["rgb"].sum().backward()  # no gradient flows into weights/depth: None grads handled
        assert s.grad.dtype == dtype and c.grad.dtype == dtype
        ref_out = ref.volume_render(s.detach().float(), c.detach().float(), t_s, t_e, ray_idx, 300, info)
        torch.testing.assert_close(out["rgb"], ref_out["rgb"], rtol=1e-5, atol=1e-5)


class _CountingModule:
    """Proxy of the compiled extension that counts the calls into it."""

    def __init__(self, module, counts: Counter) -> None:
        self._module, self._counts = module, counts

    def __getattr__(self, name: str):
        fn = getattr(self._module, name)
        if not callable(fn):
            return fn

        def counted(*args, **kwargs):
            self._counts[name] += 1
            return fn(*args, **kwargs)

        return counted


def _counted(fn, counts: Counter, name: str):
    def wrapper(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_no_op_falls_back_to_the_reference(backend, monkeypatch):
    """Occupancy updates, a training render (compaction, backward) and an eval render on CUDA through
    ``get_ops(backend)``: every op runs the extension; no reference op or torch hash/SH encoding runs."""
    from nerf_lightning.models import encoding as enc_mod
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer

    ext_calls, cu_calls, ref_calls = Counter(), Counter(), Counter()
    real_ext = _support.ext()
    monkeypatch.setattr(_support, "ext", lambda: _CountingModule(real_ext, ext_calls))
    for name in OP_NAMES:
        monkeypatch.setattr(cu, name, _counted(getattr(cu, name), cu_calls, name))
    for name in set(OP_NAMES) - REFERENCE_REUSED:  # hash_encode and sh_encode among them
        monkeypatch.setattr(ref, name, _counted(getattr(ref, name), ref_calls, name))
    monkeypatch.setattr(enc_mod, "hash_encode_fused", _counted(enc_mod.hash_encode_fused, ref_calls, "fused"))

    torch.manual_seed(0)
    field = NGPField(aabb_scale=2, encoding=dict(n_levels=8, log2_hashmap_size=14), backend="cuda").to(DEV)
    grid = OccupancyGrid(aabb_scale=2, resolution=32, ops=backend).to(DEV)
    grid.update(0, field.density)  # warm-up: every cell
    grid.update(1000, field.density, threshold=0.0)  # sampled cells, among them occupied ones
    renderer = Renderer(grid, backend=backend)
    gen = torch.Generator(device=DEV).manual_seed(1)
    o, d = random_rays(1024, 3.0, gen)
    bg = torch.rand(1024, 3, device=DEV, generator=gen)
    out = renderer.render_rays(field, o, d, bg, jitter=True)
    out.rgb.square().sum().backward()
    renderer.render_image(field, o, d, bg, chunk=300)
    ops = get_ops(backend)
    bits = ops.pack_bitfield(grid.binaries)
    assert torch.equal(ops.unpack_bitfield(bits, grid.n_cascades, grid.resolution), grid.binaries)

    assert not ref_calls, f"reference ops ran on CUDA tensors: {dict(ref_calls)}"
    expected = {
        "ray_aabb_intersect",
        "march_rays",
        "render_weights",
        "volume_render",
        "grid_cell_positions",
        "grid_ema_update",
        "pack_bitfield",
        "unpack_bitfield",
        "hash_encode",
        "sh_encode",
    }
    assert expected <= set(cu_calls), f"never dispatched to ops.cuda: {expected - set(cu_calls)}"
    assert sum(ext_calls.values()) >= len(expected), dict(ext_calls)


def test_renderer_and_field_cuda_path_equals_torch_path():
    """End to end: the default field + renderer give the same image and gradients on both paths."""
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer

    torch.manual_seed(0)
    field = NGPField(aabb_scale=2).to(DEV)
    with torch.no_grad():
        field.encoding.params.uniform_(-0.5, 0.5)
    grid = OccupancyGrid(aabb_scale=2, resolution=64).to(DEV)
    gen = torch.Generator(device=DEV).manual_seed(2)
    grid.binaries.copy_(make_binaries(2, 64, gen))
    o, d = random_rays(2048, 3.0, gen)
    bg = torch.rand(2048, 3, device=DEV, generator=gen)
    outs = []
    for backend in ("cuda", "torch"):
        field.encoding.backend = as_backend(backend)
        field.zero_grad(set_to_none=True)
        out = Renderer(grid, backend=backend).render_rays(field, o, d, bg, jitter=False)
        out.rgb.square().sum().backward()
        grads = [p.grad.detach().clone() for p in field.parameters()]
        outs.append((out.rgb.detach(), out.depth.detach(), grads))
    (rgb_c, dep_c, g_c), (rgb_t, dep_t, g_t) = outs
    torch.testing.assert_close(rgb_c, rgb_t, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dep_c, dep_t, rtol=1e-4, atol=1e-4)
    for a, b in zip(g_c, g_t, strict=True):
        assert rel_err(a, b) < 1e-3
