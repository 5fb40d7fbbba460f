"""benchmarks.rounded_gradients: grad_exchange=bf16's rounding, emulated on one process."""

import torch

from benchmarks.rounded_gradients import RoundedGradients


def test_rounded_gradients_keep_8_significant_bits_before_the_step() -> None:
    """One process emulating grad_exchange=bf16: each gradient is rounded to the nearest bfloat16
    (8 significant bits, ties to even) before the optimizer reads it."""
    w, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(1))
    w.grad = torch.tensor([1 + 2.0**-9, 1 + 3 * 2.0**-8, 3 + 2.0**-8, -(2.0**-20) * (1 + 2.0**-10)])
    opt = torch.optim.SGD([{"params": [w]}, {"params": [b]}], lr=1.0)  # b has no gradient: left alone
    RoundedGradients().on_before_optimizer_step(None, None, opt)  # type: ignore[arg-type]
    # 1 + 2^-9: below half a unit (2^-7) -> 1; 1 + 3 x 2^-8 = 1 + 1.5 units -> a tie, to even (1 + 2^-6);
    # 3 + 2^-8: a quarter unit above 3 (unit 2^-6 in [2, 4)) -> 3; the tiny one keeps its exponent
    assert w.grad.tolist() == [1.0, 1 + 2.0**-6, 3.0, -(2.0**-20)]
    assert b.grad is None
