"""The tiny-cuda-nn backend of the hash encoding on a CPU: the layout conversion, the level sizes tcnn
would use, the refusals, and the plumbing of ``ops.tcnn.TcnnHashGrid`` against a stand-in
``tinycudann`` whose kernel is our reference applied to tcnn's flat parameter vector. The GPU suite
runs the real tcnn against our reference (``tests/models/test_encoding_tcnn.py``)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.ops import reference as ref
from nerf_lightning.ops import tcnn

GRANULARITY = 128


def _fake_tinycudann(monkeypatch: pytest.MonkeyPatch, n_params_delta: int = 0) -> list[tuple]:
    """Install a ``tinycudann`` whose Encoding computes ``ops.reference.hash_encode`` on the flat
    parameter vector it is given (rows of tcnn's emulated sizes); returns its call log."""
    calls: list[tuple] = []

    class Native:
        def __init__(self, config: dict, dtype: torch.dtype) -> None:
            self.config, self.dtype = config, dtype
            args = (config["n_levels"], config["n_features_per_level"], config["log2_hashmap_size"])
            self.offsets, _ = tcnn.tcnn_level_offsets(
                *args, config["base_resolution"], config["per_level_scale"]
            )
            self.scales = tcnn.tcnn_level_scales(
                config["n_levels"], config["base_resolution"], config["per_level_scale"]
            )

        def n_params(self) -> int:
            return self.offsets[-1] * self.config["n_features_per_level"] + n_params_delta

        def encode(self, x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
            table = tcnn.from_tcnn_params(flat, self.config["n_features_per_level"])
            res = [int(torch.tensor(s).ceil()) + 1 for s in self.scales]
            return ref.hash_encode(x, table, self.scales, res, self.offsets).to(self.dtype)

    class ModuleFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, native, x, params, loss_scale):  # noqa: ANN001
            calls.append((tuple(x.shape), x.dtype, x.is_contiguous(), params.dtype, tuple(params.shape)))
            ctx.save_for_backward(x, params)
            ctx.native = native
            return native.encode(x, params)

        @staticmethod
        def backward(ctx, g):  # noqa: ANN001
            x, params = ctx.saved_tensors
            with torch.enable_grad():
                p = params.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(ctx.native.encode(x, p), p, g)
            return None, None, grad, None

    class Encoding:
        def __init__(self, n_input_dims: int, encoding_config: dict, dtype: torch.dtype) -> None:
            assert n_input_dims == 3
            self.native_tcnn_module = Native(encoding_config, dtype)
            self.loss_scale = 128.0 if dtype == torch.float16 else 1.0

    mod = types.ModuleType("tinycudann")
    mod.Encoding = Encoding
    modules = types.ModuleType("tinycudann.modules")
    modules._C = types.SimpleNamespace(batch_size_granularity=lambda: GRANULARITY)
    modules._module_function = ModuleFunction
    mod.modules = modules
    monkeypatch.setitem(sys.modules, "tinycudann", mod)
    monkeypatch.setitem(sys.modules, "tinycudann.modules", modules)
    return calls


# ----------------------------------------------------------------------------- layout and conversion
@pytest.mark.parametrize("aabb_scale", [1, 2, 16])
def test_tcnn_sizes_the_default_grids_as_we_do(aabb_scale: int) -> None:
    """instant-ngp's grid (L=16, F=2, T=2^19, 16..2048 per unit cube) at the boxes of our captures:
    tcnn's level sizes (its constructor's formula, emulated) equal ours, level by level."""
    enc = HashEncoding(max_resolution=2048 * aabb_scale, backend="torch")
    offsets, unsure = tcnn.tcnn_level_offsets(16, 2, 19, 16, enc.per_level_scale)
    assert offsets == enc.offsets and unsure == []
    if aabb_scale == 1:  # by hand: dense levels of resolution 16, 23, 31, 43, 59 (rounded up to 8), 11 hashed
        sizes = [b - a for a, b in zip(enc.offsets[:-1], enc.offsets[1:], strict=True)]
        assert sizes == [4096, 12168, 29792, 79512, 205384] + [2**19] * 11
    # the scales differ by float32 ulps only: 1.3e-3 of 2047 at the finest level here
    assert 0 < tcnn.scale_mismatch(enc.scales, 16, 16, enc.per_level_scale) < 1e-6


def test_power_of_two_level_scales_are_the_same_in_both() -> None:
    enc = HashEncoding(n_levels=8, base_resolution=16, max_resolution=2048, backend="torch")
    assert enc.per_level_scale == pytest.approx(2.0, abs=1e-12)
    assert (
        tcnn.tcnn_level_scales(8, 16, enc.per_level_scale)
        == enc.scales
        == [16.0 * 2**k - 1 for k in range(8)]
    )
    assert tcnn.scale_mismatch(enc.scales, 8, 16, enc.per_level_scale) == 0.0


def test_the_conversion_is_a_view_in_tcnn_order() -> None:
    table = torch.arange(24.0).view(12, 2)  # 12 entries, F = 2
    flat = tcnn.to_tcnn_params(table)
    assert flat.data_ptr() == table.data_ptr() and flat.tolist() == list(range(24))
    assert flat[2 * 5 + 1] == table[5, 1]  # entry e, feature f at e * F + f
    back = tcnn.from_tcnn_params(flat, 2)
    assert torch.equal(back, table) and back.data_ptr() == table.data_ptr()
    with pytest.raises(ValueError, match="a multiple of F=4"):
        tcnn.from_tcnn_params(flat[:22], 4)
    with pytest.raises(ValueError, match=r"table \[rows, F\]"):
        tcnn.to_tcnn_params(flat)


def test_hashgrid_config_is_ours() -> None:
    enc = HashEncoding(n_levels=4, n_features_per_level=4, log2_hashmap_size=12, base_resolution=8,
                       max_resolution=64, backend="torch")  # fmt: skip
    assert enc._tcnn.config == {
        "otype": "HashGrid",
        "n_levels": 4,
        "n_features_per_level": 4,
        "log2_hashmap_size": 12,
        "base_resolution": 8,
        "per_level_scale": enc.per_level_scale,
        "interpolation": "Linear",
    }
    assert enc.per_level_scale == pytest.approx(2.0)


def test_a_grid_tcnn_sizes_differently_is_refused_in_one_line() -> None:
    """16 levels from 2 to 64: tcnn's float32 scale of a dense level falls on the other side of an
    integer than ours, so its table would be laid out differently."""
    with pytest.raises(ValueError, match=r"^model.net.backend=tcnn: tiny-cuda-nn sizes level \d+ "):
        HashEncoding(n_levels=16, base_resolution=2, max_resolution=64, backend="tcnn")
    HashEncoding(n_levels=16, base_resolution=2, max_resolution=64, backend="cuda")  # ours is fine


def test_construction_says_how_far_tcnn_is_from_our_features(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nerf_lightning.models.encoding")
    HashEncoding(backend="tcnn")
    (line,) = [r.getMessage() for r in caplog.records]
    assert (
        line.startswith("hash encoding backend=tcnn: the same table layout (") and "6.6e-07 relative" in line
    )


# ----------------------------------------------------------------------------- TcnnHashGrid
def test_tcnn_grid_runs_our_table_padded_and_differentiable(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_tinycudann(monkeypatch)
    enc = HashEncoding(n_levels=8, log2_hashmap_size=12, base_resolution=4, max_resolution=64)
    with torch.no_grad():
        enc.params.uniform_(-1, 1)
    x = torch.rand(300, 3, generator=torch.Generator().manual_seed(0))
    out = enc._tcnn(x, enc.params)
    assert calls == [
        ((384, 3), torch.float32, True, torch.float32, (enc.offsets[-1] * 2,))
    ]  # padded to 3 * 128
    want = ref.hash_encode(x, enc.params, enc.scales, enc.resolutions, enc.offsets)
    assert out.shape == (300, 16) and out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0, atol=1e-4)  # the stand-in uses tcnn's scales
    g = torch.randn_like(out)
    (out * g).sum().backward()
    assert enc.params.grad is not None and enc.params.grad.shape == enc.params.shape
    p = enc.params.detach().clone().requires_grad_(True)
    (ref.hash_encode(x, p, enc.scales, enc.resolutions, enc.offsets) * g).sum().backward()
    torch.testing.assert_close(enc.params.grad, p.grad, rtol=0, atol=1e-3)
    # fp16 tables go as they are (tcnn's Fp16 precision); the output comes back as float32
    half = enc.params.detach().half()
    assert enc._tcnn(x, half).dtype == torch.float32 and calls[-1][3] == torch.float16
    with pytest.raises(ValueError, match="tables are float32 or float16"):
        enc._tcnn(x, enc.params.detach().double())


def test_tcnn_grid_refuses_a_table_tcnn_lays_out_differently(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tinycudann(monkeypatch, n_params_delta=16)
    enc = HashEncoding(n_levels=4, log2_hashmap_size=10, base_resolution=4, max_resolution=32)
    with pytest.raises(RuntimeError, match=r"tiny-cuda-nn lays this grid out in \d+ parameters, ours in"):
        enc._tcnn(torch.rand(8, 3), enc.params)


def test_checkpoints_move_between_backends_as_they_are() -> None:
    """The table of record is the same tensor for every backend: a state dict saved under one loads
    under another without conversion (the layout is tcnn's flat order)."""
    grid = dict(n_levels=4, log2_hashmap_size=10, base_resolution=4, max_resolution=32)
    src, dst = HashEncoding(**grid, backend="cuda"), HashEncoding(**grid, backend="tcnn")
    state = src.state_dict()
    assert list(state) == ["params"]
    dst.load_state_dict(state)
    assert torch.equal(dst.params, src.params)
    import copy

    twin = copy.deepcopy(dst)  # the tcnn runner rebuilds its native module on first use
    assert twin._tcnn is not dst._tcnn and twin._tcnn.config == dst._tcnn.config


def test_backend_tcnn_swaps_the_hash_grid_only() -> None:
    """tiny-cuda-nn's FullyFusedMLP has no bias terms and our field's layers have them: under
    ``model.net.backend=tcnn`` the MLPs stay ours (fused under mixed precision), and so do the other ops."""
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.ops import get_ops

    field = NGPField(backend="tcnn")
    assert field.encoding.backend.name == "tcnn" and field.backend.fuses_mlp
    assert field.backend.ops is get_ops("auto") and field.direction_encoding.backend.ops is get_ops("auto")
