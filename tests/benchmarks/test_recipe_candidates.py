"""The research tool of instant-ngp's recipe still to be judged at 300 s (issue 64): the weight average
that renders (``benchmarks/weight_ema.py``), against numbers worked out by hand from tiny-cuda-nn's
``EmaOptimizer``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from benchmarks.weight_ema import WeightEMA


def _module(value: float) -> SimpleNamespace:
    field = nn.Module()
    field.w = nn.Parameter(torch.full((2,), value))
    return SimpleNamespace(field=field)


def test_the_average_is_debiased_and_renders_then_hands_the_trained_weights_back() -> None:
    ema = WeightEMA(decay=0.5)
    module = _module(0.0)
    trainer = SimpleNamespace(accumulate_grad_batches=1)
    for value in (4.0, 8.0):  # the weights after steps 1 and 2
        module.field.w.data.fill_(value)
        ema.on_train_batch_end(trainer, module, None, None, 0)
    # ema_2 = 0.5 * (0.5 * 4) + 0.5 * 8 = 5, debiased by 1 - 0.5^2 = 0.75: 6.6667
    assert ema.averaged()[0].tolist() == pytest.approx([20 / 3, 20 / 3])
    ema.on_validation_start(trainer, module)
    assert module.field.w.tolist() == pytest.approx([20 / 3, 20 / 3])
    ema.on_validation_end(trainer, module)
    assert module.field.w.tolist() == [8.0, 8.0]
    assert ema.summary() == {"weight_ema/decay": 0.5, "weight_ema/steps": 2.0}


def test_the_average_skips_the_accumulation_micro_batches() -> None:
    ema = WeightEMA(decay=0.9)
    module = _module(1.0)
    trainer = SimpleNamespace(accumulate_grad_batches=2)
    for batch_idx in range(4):
        ema.on_train_batch_end(trainer, module, None, None, batch_idx)
    assert ema.steps == 2
    with pytest.raises(ValueError, match="decay"):
        WeightEMA(decay=1.0)
