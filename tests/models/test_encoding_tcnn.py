"""tiny-cuda-nn's HashGrid (``model.net.field.encoding.backend=tcnn``) against our reference on the same
table. GPU only, and only where ``tinycudann`` imports: ``pytest -m cuda tests/models/test_encoding_tcnn.py``.

Tolerances come from the one documented difference (``ops/tcnn.py``): tcnn's level scale is
``exp2f(l * log2f(s)) * base - 1`` with a fast-math exp2, ours ``float32(base * s^l - 1)``, and tcnn
rounds the position once (fma) where we round twice. A point therefore sits ``dpos_l`` cells apart in
the two, per axis at most ``|s_ours - s_tcnn| + 6e-7 s + 2 ulp(s + 1)`` (exp2f and log2f errors,
the roundings); a trilinear feature moves by at most ``3 dpos_l`` times the largest corner difference
(``2 max|table|``), and a corner weight by at most ``3 dpos_l``. The bounds below are these, doubled.
Wrong hashing, level sizes or layout would miss them by orders of magnitude (features of unrelated
entries differ by ~``max|table|``).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.ops import reference as ref
from nerf_lightning.ops import tcnn

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU CI
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
_WHY = tcnn.available()
if _WHY is not None:  # pragma: no cover - machines without the wheel
    pytest.skip(f"tinycudann does not import ({_WHY}): see docs/tcnn.md", allow_module_level=True)

DEV = torch.device("cuda")
#: (name, HashEncoding kwargs): power-of-two level scales (equal in both), instant-ngp's grid over
#: the unit cube (lego), and over a 16-unit box (a capture with aabb_scale 16)
CONFIGS = [
    ("pow2_L8", dict(n_levels=8, base_resolution=16, max_resolution=2048)),
    ("ngp_L16", dict()),
    ("ngp_L16_box16", dict(max_resolution=2048 * 16)),
]


def _dpos(enc: HashEncoding) -> list[float]:
    """Per level, the bound on how far apart (in cells, per axis) tcnn and we place a point in [0,1]."""
    theirs = tcnn.tcnn_level_scales(enc.n_levels, enc.base_resolution, enc.per_level_scale)
    out = []
    for s, t in zip(enc.scales, theirs, strict=True):
        ulp = float(np.spacing(np.float32(s + 1.0)))
        out.append(abs(s - t) + 6e-7 * abs(s) + 2 * ulp)
    return out


def _encodings(cfg: dict, dtype: torch.dtype, seed: int = 0) -> tuple[HashEncoding, HashEncoding]:
    torch.manual_seed(seed)
    ours = HashEncoding(**cfg, backend="cuda", param_dtype=dtype).to(DEV)
    with torch.no_grad():
        ours.params.uniform_(-1, 1)
    theirs = HashEncoding(**cfg, backend="tcnn", param_dtype=dtype).to(DEV)
    theirs.load_state_dict(ours.state_dict())  # the same table: no conversion
    return ours, theirs


@pytest.mark.parametrize("name,cfg", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_tcnn_features_equal_ours_for_the_same_table(name: str, cfg: dict, dtype: torch.dtype) -> None:
    ours, theirs = _encodings(cfg, dtype)
    assert theirs.resolve_backend(torch.zeros(1, 3, device=DEV)) == "tcnn"
    x = torch.rand(1 << 18, 3, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))
    x[:4] = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [1.0, 0.0, 1.0]], device=DEV)
    with torch.no_grad():
        got = theirs(x)
        want = ref.hash_encode(x, ours.params.float(), ours.scales, ours.resolutions, ours.offsets)
    assert got.dtype == torch.float32 and got.shape == want.shape == (x.shape[0], ours.n_output_dims)
    vmax = float(ours.params.abs().max())
    # fp16: tcnn accumulates the 8 corners in half (8 roundings of 2^-11 relative)
    rounding = 1e-5 if dtype == torch.float32 else 8 * 2.0**-11 * vmax
    err = (got - want).abs().view(x.shape[0], ours.n_levels, -1)
    report = []
    for level, dpos in enumerate(_dpos(ours)):
        bound = 2 * (3 * dpos * 2 * vmax + rounding)
        worst, mean = float(err[:, level].max()), float(err[:, level].mean())
        report.append(f"L{level} max {worst:.2e} mean {mean:.2e} bound {bound:.2e}")
        assert worst <= bound and mean <= bound / 3, f"{name} {dtype}: " + "; ".join(report)
    print(f"{name} {dtype}: " + "; ".join(report))


@pytest.mark.parametrize("name,cfg", CONFIGS[:2], ids=[c[0] for c in CONFIGS[:2]])
def test_tcnn_gradient_wrt_the_table_equals_ours(name: str, cfg: dict) -> None:
    ours, theirs = _encodings(cfg, torch.float32, seed=2)
    gen = torch.Generator(device=DEV).manual_seed(3)
    x = torch.rand(1 << 18, 3, device=DEV, generator=gen)
    g = torch.randn(x.shape[0], ours.n_output_dims, device=DEV, generator=gen)
    (theirs(x) * g).sum().backward()
    (ours(x) * g).sum().backward()
    got, want = theirs.params.grad, ours.params.grad
    f = ours.n_features_per_level
    report = []
    for level, dpos in enumerate(_dpos(ours)):
        rows = slice(ours.offsets[level], ours.offsets[level + 1])
        # every point hands each level's features the sum of its 8 weights (= 1) times g: exact sums
        g_sum = g[:, level * f : (level + 1) * f].double().sum(0)
        torch.testing.assert_close(got[rows].double().sum(0), g_sum, rtol=1e-4, atol=1e-2)
        rel = float((got[rows] - want[rows]).norm() / want[rows].norm())
        bound = 2 * (8 * 3 * dpos + 1e-5)  # a weight moves by <= 3 dpos; weights average 1/8
        report.append(f"L{level} rel {rel:.2e} bound {bound:.2e}")
        assert rel <= bound, f"{name}: " + "; ".join(report)
    print(f"{name}: " + "; ".join(report))


def test_a_checkpoint_moves_from_cuda_to_tcnn_and_back() -> None:
    """Train a few steps with one backend, save, load under the other: the same table, the same
    features (within the bound above), and training continues from it."""
    from nerf_lightning.models.field import NGPField

    def field(backend: str) -> NGPField:
        torch.manual_seed(0)
        return NGPField(aabb_scale=1, backend=backend).to(DEV)

    x = torch.rand(1 << 16, 3, device=DEV, generator=torch.Generator(device=DEV).manual_seed(4))
    for first, second in (("cuda", "tcnn"), ("tcnn", "cuda")):
        a = field(first)
        opt = torch.optim.Adam(a.parameters(), lr=1e-2)
        for _ in range(5):
            opt.zero_grad()
            a.density(x).square().mean().backward()
            opt.step()
        buf = io.BytesIO()
        torch.save(a.state_dict(), buf)
        b = field(second)
        b.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        assert torch.equal(b.encoding.params, a.encoding.params)
        with torch.no_grad():
            fa, fb = a.encoding(x), b.encoding(x)
        bound = 2 * 3 * max(_dpos(a.encoding)) * 2 * float(a.encoding.params.abs().max()) + 1e-5
        assert float((fa - fb).abs().max()) <= bound, (first, second)
        b.density(x).sum().backward()  # the loaded table trains under the other backend
        assert b.encoding.params.grad is not None and float(b.encoding.params.grad.abs().sum()) > 0


def test_tcnn_under_autocast_and_in_a_cuda_graph() -> None:
    """The training step runs under autocast and is replayed as CUDA graphs: tcnn's output stays
    float32, and a graphed forward/backward equals eager calls."""
    _, enc = _encodings(CONFIGS[1][1], torch.float32, seed=5)
    lin = torch.nn.Linear(enc.n_output_dims, 1).to(DEV)
    x = torch.rand(1 << 16, 3, device=DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert enc(x).dtype == torch.float32

    def net(pts: torch.Tensor) -> torch.Tensor:
        return lin(enc(pts)).square().mean()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc, self.lin = enc, lin

        def forward(self, pts: torch.Tensor) -> torch.Tensor:
            return net(pts)

    module = Net()
    # as models/train_step.capture does: tcnn's workspace exists on the capture stream before capturing
    from nerf_lightning.models.train_step import holds_tcnn, warm_capture_stream

    assert holds_tcnn(module)
    warm_capture_stream(module, (x.clone(),))
    graphed = torch.cuda.make_graphed_callables(module, (x.clone(),), num_warmup_iters=3)
    for step in range(3):
        pts = torch.rand_like(x)
        enc.params.grad = None
        eager = net(pts)
        eager.backward()
        g_eager = enc.params.grad.clone()
        enc.params.grad = None
        replay = graphed(pts)
        replay.backward()
        torch.testing.assert_close(replay, eager, rtol=1e-5, atol=0.0, msg=f"step {step}")
        # tcnn scatters the table gradient with atomics: equal up to the order of the additions
        rel = float((enc.params.grad - g_eager).norm() / g_eager.norm())
        assert float(g_eager.norm()) > 0 and rel < 1e-4, (step, rel)


def test_auto_keeps_our_kernels_until_tcnn_is_listed_for_this_gpu() -> None:
    from nerf_lightning.ops import TCNN_FASTER_ON

    enc = HashEncoding(n_levels=4, log2_hashmap_size=12, backend="auto").to(DEV)
    want = "tcnn" if torch.cuda.get_device_name() in TCNN_FASTER_ON else "cuda"
    assert enc.resolve_backend(torch.rand(8, 3, device=DEV)) == want
    assert math.isfinite(float(enc(torch.rand(8, 3, device=DEV)).sum()))
