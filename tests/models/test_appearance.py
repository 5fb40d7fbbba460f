"""The per-view exposure as a component: what it does to a rendered colour, its gauge, its group."""

from __future__ import annotations

import math

import pytest
import torch

from nerf_lightning.models.appearance import PerViewExposure


def test_gain_scales_the_scene_not_the_background() -> None:
    exp = PerViewExposure(2, enabled=True, bias=True)
    with torch.no_grad():
        exp.log_gain.copy_(torch.tensor([[0.2, 0.0, -0.4], [-0.2, 0.0, 0.4]]))  # zero-mean already
        exp.offset.copy_(torch.tensor([[0.05, 0.0, 0.0], [-0.05, 0.0, 0.0]]))
    bg = torch.tensor([[0.3, 0.6, 0.9]]).expand(3, 3)
    scene = torch.tensor([[0.5, 0.4, 0.2], [0.25, 0.2, 0.1], [0.0, 0.0, 0.0]])  # sum_i w_i c_i
    alpha = torch.tensor([[1.0], [0.5], [0.0]])
    rgb = scene + (1 - alpha) * bg  # what the renderer composites
    out = exp(torch.tensor([0, 0, 1]), rgb, alpha, bg)
    gain0 = torch.tensor([math.exp(0.2), 1.0, math.exp(-0.4)])
    torch.testing.assert_close(out[0], gain0 * scene[0] + torch.tensor([0.05, 0, 0]))
    torch.testing.assert_close(out[1], gain0 * scene[1] + 0.5 * torch.tensor([0.05, 0, 0]) + 0.5 * bg[1])
    torch.testing.assert_close(out[2], bg[2])  # background only: untouched by view 1's exposure


def test_a_common_gain_is_the_fields_not_the_views() -> None:
    """The applied gains have geometric mean 1 over the training views: adding the same log-gain to
    every view changes nothing, so held-out views rendered with gain 1 see the views' mean exposure."""
    exp = PerViewExposure(4, enabled=True)
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) * 0.3
    with torch.no_grad():
        exp.log_gain.copy_(g)
    before = exp.gains().detach().clone()
    torch.testing.assert_close(before.log().mean(0), torch.zeros(3), rtol=0, atol=1e-6)
    with torch.no_grad():
        exp.log_gain.add_(0.7)
    torch.testing.assert_close(exp.gains().detach(), before, rtol=1e-6, atol=0)


def test_group_follows_the_main_schedule_unless_given_a_learning_rate() -> None:
    exp = PerViewExposure(3, enabled=True)
    group = exp.parameter_group(100)
    assert "lr" not in group.as_dict() and group.lr_lambda is None
    assert group.params == [exp.log_gain]
    assert PerViewExposure(3, enabled=True, lr=1e-3, bias=True).parameter_group(100).as_dict()["lr"] == 1e-3
    assert not PerViewExposure(3).enabled and PerViewExposure(3, enabled="auto", photograph=True).enabled
    with pytest.raises(ValueError, match="model.net.appearance.enabled"):
        PerViewExposure(3, enabled="yes")
