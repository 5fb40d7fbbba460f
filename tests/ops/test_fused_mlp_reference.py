"""``ops.reference.fused_mlp`` (the contract of the fused half-precision MLP kernels) and the
field's choice between the fused kernels and the ``torch.nn`` layers, on the CPU."""

from __future__ import annotations

import pytest
import torch

from nerf_lightning.models.field import NGPField
from nerf_lightning.ops import get_ops
from nerf_lightning.ops import reference as ref


def _float64_network(x: torch.Tensor, weights, biases) -> torch.Tensor:
    x = x.double()
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        x = x @ w.double().t() + b.double()
        if i + 1 < len(weights):
            x = torch.relu(x)
    return x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_exact_values_give_the_float64_network(dtype) -> None:
    # Inputs in {-2..2} and weights in quarters keep every hidden value a small multiple of 1/4,
    # exact in both half types: the result is the float64 network's, with cat(in0, in1) in that
    # order, ReLU on the hidden layers only and the bias of every layer.
    g = torch.Generator().manual_seed(0)
    in0 = torch.randint(-2, 3, (40, 5), generator=g).float()
    in1 = torch.randint(-2, 3, (40, 3), generator=g).float()
    weights = [torch.randint(-1, 2, (o, i), generator=g).float() / 4 for o, i in [(16, 8), (16, 16), (2, 16)]]
    biases = [torch.randint(-2, 3, (o,), generator=g).float() / 4 for o in (16, 16, 2)]
    out = ref.fused_mlp(in0, in1, weights, biases, dtype)
    expected = _float64_network(torch.cat([in0, in1], dim=-1), weights, biases)
    assert out.dtype == torch.float32
    assert torch.equal(out.double(), expected)
    assert (expected < 0).any()  # the output layer has no ReLU: negative outputs survive


def test_hidden_activations_and_weights_are_rounded_to_the_half_type() -> None:
    # bfloat16 keeps 8 significant bits. Weights: 1 + 2^-9 rounds to 1, so the hidden value of
    # x = 3 is exactly 3. Activations: W0 = 1 + 2^-7 is exact, the hidden value 3 + 3 * 2^-7 lies
    # halfway between 3 + 2^-6 and 3 + 2^-5 and rounds to the even one, 3 + 2^-5. float16 (11 bits)
    # keeps all of these values.
    x = torch.tensor([[3.0]])
    b = [torch.tensor([0.0]), torch.tensor([0.5])]
    w_round = [torch.tensor([[1.0 + 2**-9]]), torch.tensor([[1.0 + 2**-7]])]
    assert float(ref.fused_mlp(x, None, w_round, b, torch.bfloat16)) == 3.0 * (1.0 + 2**-7) + 0.5
    assert float(ref.fused_mlp(x, None, w_round, b, torch.float16)) == (3.0 + 3 * 2**-9) * (1.0 + 2**-7) + 0.5
    w_out = [torch.tensor([[1.0]]), torch.tensor([[1.0 + 2**-9]])]  # the output layer's weight alone
    assert float(ref.fused_mlp(x, None, w_out, b, torch.bfloat16)) == 3.0 + 0.5
    assert float(ref.fused_mlp(x, None, w_out, b, torch.float16)) == 3.0 * (1.0 + 2**-9) + 0.5
    w_act = [torch.tensor([[1.0 + 2**-7]]), torch.tensor([[1.0]])]
    assert float(ref.fused_mlp(x, None, w_act, b, torch.bfloat16)) == 3.0 + 2**-5 + 0.5
    assert float(ref.fused_mlp(x, None, w_act, b, torch.float16)) == 3.0 + 3 * 2**-7 + 0.5
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ref.fused_mlp(x, None, w_act, b, torch.float32)


def test_gradients_flow_to_the_first_input_and_every_parameter() -> None:
    torch.manual_seed(0)
    in0 = torch.randn(64, 6, requires_grad=True)
    in1 = torch.randn(64, 2)
    weights = [torch.randn(8, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)]
    biases = [torch.randn(8, requires_grad=True), torch.randn(3, requires_grad=True)]
    out = ref.fused_mlp(in0, in1, weights, biases, torch.float16)
    out.square().sum().backward()
    for t in (in0, *weights, *biases):
        assert t.grad is not None and t.grad.abs().sum() > 0
    # the float64 network's gradients, within half rounding
    x0 = in0.detach().double().requires_grad_()
    ps = [p.detach().double().requires_grad_() for p in (*weights, *biases)]
    _float64_network(torch.cat([x0, in1.double()], -1), ps[:2], ps[2:]).square().sum().backward()
    for t, t64 in zip((in0, *weights, *biases), (x0, *ps), strict=True):
        torch.testing.assert_close(
            t.grad.double(), t64.grad, rtol=0.02, atol=0.02 * float(t64.grad.abs().max())
        )


def test_the_auto_ops_namespace_dispatches_cpu_tensors_to_the_reference() -> None:
    ops = get_ops("auto")
    x = torch.randn(10, 4)
    w, b = [torch.randn(2, 4)], [torch.zeros(2)]
    assert torch.equal(
        ops.fused_mlp(x, None, w, b, torch.bfloat16), ref.fused_mlp(x, None, w, b, torch.bfloat16)
    )


def test_the_field_keeps_the_torch_layers_off_cuda_autocast_and_checks_its_backend() -> None:
    field = NGPField(aabb_scale=1, encoding={"log2_hashmap_size": 12}, backend="torch")
    x = torch.rand(100, 3)
    assert field._fused_dtype(x) is None  # CPU tensors: nn.Linear layers, fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert field._fused_dtype(x) is None  # only CUDA autocast selects the kernels
    with pytest.raises(ValueError, match="model.net.backend=fast: expected one of auto, cuda, tcnn, torch"):
        NGPField(backend="fast")
    # networks beyond the kernels' shapes keep the torch layers under mixed precision
    assert field._fusable
    assert not NGPField(hidden_dim=128)._fusable
    assert not NGPField(color_hidden_layers=3)._fusable


@pytest.mark.parametrize(
    ("in_width", "sizes", "dtype", "ok"),
    [
        (32, [64, 16], torch.float32, True),  # the density network
        (32, [64, 64, 3], torch.float32, True),  # the colour network's shape
        (64, [64, 64], torch.float32, True),  # widest input and output
        (65, [64, 16], torch.float32, False),  # input too wide
        (32, [64, 65], torch.float32, False),  # output too wide
        (32, [128, 16], torch.float32, False),  # hidden layer not 64 wide
        (32, [16], torch.float32, False),  # no hidden layer
        (32, [64, 64, 64, 3], torch.float32, False),  # three hidden layers
        (32, [64, 16], torch.float16, False),  # half master weights
    ],
)
def test_fused_mlp_shapes(in_width: int, sizes: list[int], dtype: torch.dtype, ok: bool) -> None:
    from nerf_lightning.ops.fused_mlp_support import fused_mlp_shapes_ok

    widths = [in_width, *sizes]
    weights = [torch.zeros(o, i, dtype=dtype) for i, o in zip(widths[:-1], widths[1:], strict=True)]
    biases = [torch.zeros(o, dtype=dtype) for o in sizes]
    assert fused_mlp_shapes_ok(in_width, weights, biases) is ok
    assert not fused_mlp_shapes_ok(in_width + 1, weights, biases)  # weights not matching the input


def test_the_fields_fused_path_computes_the_same_networks_as_its_torch_layers(monkeypatch) -> None:
    # The fused path's wiring (density MLP on the encoding; colour MLP on cat(h, SH) in that order;
    # every layer's weight and bias) on the CPU: the reference op stands in for the kernels. In
    # float16 the two paths differ only by rounding.
    torch.manual_seed(0)
    field = NGPField(aabb_scale=1, encoding={"log2_hashmap_size": 12}, backend="torch")
    with torch.no_grad():
        field.encoding.params.uniform_(-0.5, 0.5)
    pos = torch.rand(2000, 3)
    dirs = torch.nn.functional.normalize(torch.randn(2000, 3), dim=-1)
    sigma_t, rgb_t = field(pos, dirs)
    calls = []
    monkeypatch.setattr(field, "_fused_dtype", lambda x: calls.append(1) or torch.float16)
    sigma_f, rgb_f = field(pos, dirs)
    assert len(calls) == 2  # the density and the colour network
    torch.testing.assert_close(sigma_f, sigma_t, rtol=0.01, atol=1e-3)
    torch.testing.assert_close(rgb_f, rgb_t, rtol=0.01, atol=2e-3)
    assert (rgb_t - rgb_f).abs().max() > 0  # the fused path did run, in half precision
