"""The research tools of instant-ngp's recipe (issue 64): the weight average that renders
(``benchmarks/weight_ema.py``) and tiny-cuda-nn's Adam (``benchmarks/tcnn_adam.py``), against numbers worked
out by hand from their definitions in tiny-cuda-nn."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from benchmarks.tcnn_adam import TcnnAdam
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


def _adam_group(name: str, values: list[float], grad: list[float]) -> tuple[TcnnAdam, nn.Parameter]:
    p = nn.Parameter(torch.tensor(values))
    p.grad = torch.tensor(grad)
    return TcnnAdam([{"params": [p], "name": name}], lr=0.1, betas=(0.9, 0.99), eps=0.0, l2_reg=0.5), p


def test_a_table_entry_without_gradient_stands_still_and_counts_its_own_steps() -> None:
    opt, p = _adam_group("table", [1.0, 1.0], [2.0, 0.0])
    opt.step()
    # Adam's debiased first step moves by lr * sign(g), whatever |g|; no L2 on the table
    assert p.tolist() == pytest.approx([0.9, 1.0])
    p.grad = torch.tensor([0.0, -3.0])
    opt.step()
    # entry 0 untouched this step: it stays at 0.9 (torch's Adam would move it by its momentum);
    # entry 1's first step is its own step 1: lr * sign(g)
    assert p.tolist() == pytest.approx([0.9, 1.1])
    assert opt.state[p]["k"].tolist() == [1.0, 1.0]


def test_the_mlp_group_adds_l2_and_steps_every_entry() -> None:
    opt, p = _adam_group("mlp", [2.0, 2.0], [0.0, 1.0])
    opt.step()
    # g + l2 * w = [1, 2]: the first step is lr * sign(g) on both entries
    assert p.tolist() == pytest.approx([1.9, 1.9])
    p.grad = torch.tensor([0.0, 0.0])
    opt.step()
    # step 2, entry 0: g = 0.5 * 1.9 = 0.95; m = 0.9 * 0.1 + 0.1 * 0.95, v = 0.99 * 0.01 + 0.01 * 0.95^2
    m = 0.9 * 0.1 + 0.1 * 0.95
    v = 0.99 * 0.01 + 0.01 * 0.95**2
    rate = 0.1 * math.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    assert p[0].item() == pytest.approx(1.9 - rate * m / math.sqrt(v), rel=1e-5)
