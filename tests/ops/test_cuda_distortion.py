"""The distortion-loss kernels (``ops/csrc/losses.cu``: ``distortion_loss_fwd`` / ``_bwd``, wrapped by
``ops.cuda.distortion_loss``) against ``ops.reference.distortion_loss``: values and gradients on random
packed samples in both layouts (fixed-layout padding, also with nonzero weights and intervals that
must be ignored; empty and invalid rays; rays of one sample, of a warp and longer), inside a CUDA
graph and without host syncs. The training-step side is in ``test_cuda_fixed.py``. GPU only:
``pytest -m cuda``.

Tolerances: both sides sum in float64 (the kernel per ray in warp order, the reference by global
cumsums and atomics) and round to float32 once, so values agree to a float32 ulp or two; gradients
(closed form vs autograd, both float64 before the final rounding) within 1e-5 relative.
"""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.ops import get_ops
from nerf_lightning.ops import reference as ref

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)

from nerf_lightning.ops import cuda as cu  # noqa: E402
from nerf_lightning.ops.cuda import _support  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def extension_loaded():
    """Without the extension ``cu.distortion_loss`` runs the reference and every comparison below
    would pass trivially: fail instead."""
    from nerf_lightning.ops import _ext

    assert cu.is_available(), f"the CUDA extension did not load: {_ext.error()}"
    assert hasattr(_support.ext(), "distortion_loss_fwd"), "stale build: no distortion kernels"


def _poison() -> None:
    """Fill cached allocator blocks with NaN and free them: unwritten ``torch.empty`` outputs show."""
    blocks = [torch.full((n,), float("nan"), device=DEV) for n in (1 << 10, 1 << 14, 1 << 17, 1 << 20)]
    del blocks


def _layout(n_rays: int, max_count: int, pad: int, seed: int, dirty_padding: bool):
    """Random packed samples: (weights, t_starts, t_ends, ray_indices, packed_info, n_used).

    Counts are random in [0, max_count] with ~15% empty rays, and the first rays take the edge cases
    (1, 31, 32, 33, 64, 1024 samples, an empty ray). Empty rays are written as ``repack`` writes
    invalid rays (count 0, first = samples in use). Each ray's intervals are contiguous and increase
    in t from a random offset. ``pad`` padding slots follow (ray 0): zero-length with weight 0 (the
    contract) or, with ``dirty_padding``, random weights and intervals that the loss must ignore.
    """
    g = torch.Generator(device=DEV).manual_seed(seed)
    counts = torch.randint(0, max_count + 1, (n_rays,), device=DEV, generator=g)
    counts[torch.rand(n_rays, device=DEV, generator=g) < 0.15] = 0
    special = torch.tensor([1, 31, 32, 33, 64, 1024, 0, 1], device=DEV)[:n_rays]
    counts[: special.shape[0]] = special
    n_used = int(counts.sum())
    starts = torch.cumsum(counts, 0) - counts
    starts = torch.where(counts == 0, torch.full_like(starts, n_used), starts)
    info = torch.stack([starts, counts], dim=-1).contiguous()
    rays = torch.repeat_interleave(torch.arange(n_rays, device=DEV), counts)
    # within-ray start times: ray offset + exclusive cumsum of the ray's steps (float64, then float32)
    dt = torch.rand(n_used, device=DEV, generator=g, dtype=torch.float64) * 0.01 + 1e-4
    excl = torch.cumsum(dt, 0) - dt
    first = starts[rays]
    offset = torch.rand(n_rays, device=DEV, generator=g, dtype=torch.float64) * 2.0 + 0.2
    t_start = offset[rays] + (excl - excl[first])
    t_end = t_start + dt
    w = torch.rand(n_used, device=DEV, generator=g) * 0.5
    if dirty_padding:
        pad_ts = torch.rand(pad, device=DEV, generator=g, dtype=torch.float64) * 3.0
        pad_te = pad_ts + 0.05
        pad_w = torch.rand(pad, device=DEV, generator=g) + 0.5
    else:
        pad_ts = pad_te = torch.zeros(pad, device=DEV, dtype=torch.float64)
        pad_w = torch.zeros(pad, device=DEV)
    return (
        torch.cat([w, pad_w]).contiguous(),
        torch.cat([t_start, pad_ts]).float().contiguous(),
        torch.cat([t_end, pad_te]).float().contiguous(),
        torch.cat([rays, torch.zeros(pad, dtype=torch.long, device=DEV)]).contiguous(),
        info,
        n_used,
    )


def _both(w0, ts, te, rays, info, up):
    """(loss, grad) of the kernel and of the reference for the objective ``sum_r up_r L_r``."""
    out = []
    for fn in (cu.distortion_loss, ref.distortion_loss):
        w = w0.detach().clone().requires_grad_()
        loss = fn(w, ts, te, rays, info)
        (loss * up).sum().backward()
        out.append((loss.detach(), w.grad))
    return out


def _assert_grad_close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = float(want.abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * max(scale, 1e-12))


@pytest.mark.parametrize("dirty_padding", [False, True])
@pytest.mark.parametrize(
    ("n_rays", "max_count", "pad"),
    [
        (8, 40, 0),  # dynamic layout (no padding), the edge-case rays only
        (1000, 300, 5000),
        (65536, 6, 100_000),  # many short rays, a long padding run (late training)
        (600, 1024, 150_000),  # few long rays, most slots padding (a large scene early on)
    ],
)
def test_distortion_loss_equals_the_reference(n_rays, max_count, pad, dirty_padding):
    w, ts, te, rays, info, n_used = _layout(
        n_rays, max_count, pad, seed=n_rays + pad, dirty_padding=dirty_padding
    )
    up = torch.rand(n_rays, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1)) + 0.1
    _poison()
    (lc, gc), (lr, gr) = _both(w, ts, te, rays, info, up)
    assert lc.dtype == torch.float32 and lc.shape == (n_rays,) and gc.dtype == torch.float32
    assert not torch.isnan(lc).any() and not torch.isnan(gc).any(), "an output element was not written"
    torch.testing.assert_close(lc, lr, rtol=2e-6, atol=1e-9)
    assert (lc[info[:, 1] == 0] == 0).all()  # empty / invalid rays
    assert float(lc.max()) > 0
    _assert_grad_close(gc, gr)
    assert (gc[n_used:] == 0).all()  # padding: no gradient, whatever its weight


def test_distortion_loss_gradient_of_a_mean_arrives_expanded():
    """``dist.sum() / n`` (the budgeted step) sends a stride-0 gradient into the backward."""
    w0, ts, te, rays, info, _ = _layout(3000, 200, 20_000, seed=7, dirty_padding=False)
    grads = []
    for fn in (cu.distortion_loss, ref.distortion_loss):
        w = w0.clone().requires_grad_()
        (fn(w, ts, te, rays, info).sum() / 123.0).backward()
        grads.append(w.grad)
    _assert_grad_close(*grads)


def test_distortion_loss_of_no_samples_or_no_rays():
    info = torch.tensor([[0, 0], [0, 0], [0, 0]], device=DEV)
    w = torch.zeros(0, device=DEV, requires_grad=True)
    empty = torch.zeros(0, device=DEV)
    loss = cu.distortion_loss(w, empty, empty, torch.zeros(0, dtype=torch.long, device=DEV), info)
    assert loss.shape == (3,) and loss.dtype == torch.float32 and (loss == 0).all()
    loss.sum().backward()
    assert w.grad is not None and w.grad.shape == (0,)
    # rays but no samples in use: padding only
    w = torch.rand(5, device=DEV, requires_grad=True)
    ts = torch.rand(5, device=DEV)
    loss = cu.distortion_loss(w, ts, ts + 0.1, torch.zeros(5, dtype=torch.long, device=DEV), info)
    loss.sum().backward()
    assert (loss == 0).all() and (w.grad == 0).all()
    none = cu.distortion_loss(w, ts, ts + 0.1, torch.zeros(5, dtype=torch.long, device=DEV), info[:0])
    assert none.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_distortion_loss_of_half_weights_and_under_autocast(dtype):
    w0, ts, te, rays, info, _ = _layout(2000, 100, 1000, seed=11, dirty_padding=False)
    w_half = w0.to(dtype)
    (lc, gc), (lr, gr) = _both(w_half, ts, te, rays, info, torch.ones(2000, device=DEV))
    assert lc.dtype == torch.float32 and gc.dtype == dtype
    torch.testing.assert_close(lc, lr, rtol=2e-6, atol=1e-9)
    torch.testing.assert_close(gc.float(), gr.float(), rtol=1e-2, atol=1e-3)  # one rounding to dtype
    with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
        auto = cu.distortion_loss(w0, ts, te, rays, info)
    assert auto.dtype == torch.float32
    assert torch.equal(auto, cu.distortion_loss(w0, ts, te, rays, info))


def test_auto_and_cuda_backends_dispatch_to_the_kernel(monkeypatch):
    w, ts, te, rays, info, _ = _layout(100, 50, 10, seed=3, dirty_padding=False)
    calls = []
    real = _support.ext()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    monkeypatch.setattr(_support, "ext", lambda: Spy())
    for backend in ("auto", "cuda"):
        get_ops(backend).distortion_loss(w.requires_grad_(), ts, te, rays, info).sum().backward()
    assert calls.count("distortion_loss_fwd") == 2 and calls.count("distortion_loss_bwd") == 2


def test_distortion_loss_never_syncs_and_replays_in_a_cuda_graph():
    w0, ts, te, rays, info, n_used = _layout(4096, 120, 30_000, seed=5, dirty_padding=True)
    up = torch.rand(4096, device=DEV) + 0.1
    w = w0.clone().requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (and the sync check)
        torch.autograd.grad((cu.distortion_loss(w, ts, te, rays, info) * up).sum(), w)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        (gw,) = torch.autograd.grad((cu.distortion_loss(w, ts, te, rays, info) * up).sum(), w)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = cu.distortion_loss(w, ts, te, rays, info)
        (gw,) = torch.autograd.grad((loss * up).sum(), w)
    gen = torch.Generator(device=DEV).manual_seed(9)
    for _ in range(3):
        with torch.no_grad():
            w.copy_(torch.rand(w.shape, device=DEV, generator=gen) * 0.5)
        graph.replay()
        lr, gr = _ref_loss_grad(w.detach(), ts, te, rays, info, up)
        torch.testing.assert_close(loss, lr, rtol=2e-6, atol=1e-9)
        _assert_grad_close(gw, gr)
        assert (gw[n_used:] == 0).all()


def _ref_loss_grad(w0, ts, te, rays, info, up):
    w = w0.clone().requires_grad_()
    loss = ref.distortion_loss(w, ts, te, rays, info)
    (loss * up).sum().backward()
    return loss.detach(), w.grad
