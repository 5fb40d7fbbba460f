"""Held-out metrics: per-image PSNR / SSIM averaged over views; LPIPS only with local weights."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from nerf_lightning.models import metrics as M


def _image(value: float, error: float, h: int = 8, w: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gt = torch.full((h, w, 3), value)
    return gt + error, gt


def test_psnr_is_the_mean_of_per_image_psnrs() -> None:
    m = M.ViewMetrics(lpips=False)
    a, b = _image(0.5, 0.1), _image(0.5, 0.01)  # MSE 1e-2 -> 20 dB, MSE 1e-4 -> 40 dB
    assert float(m.score(*a)["psnr"]) == pytest.approx(20.0, abs=1e-4)
    assert float(m.score(*b)["psnr"]) == pytest.approx(40.0, abs=1e-3)
    m.update(*a, view=0)
    m.update(*b, view=1)
    out = m.compute()
    assert float(out["psnr"]) == pytest.approx(30.0, abs=1e-3)
    pooled = -10 * math.log10((1e-2 + 1e-4) / 2)  # 22.97 dB: what one PSNR over all pixels gives
    assert abs(float(out["psnr"]) - pooled) > 7
    assert out["views"].tolist() == [0, 1] and "lpips" not in out


def test_ssim_per_image_and_repeated_views_counted_once() -> None:
    torch.manual_seed(0)
    gt = torch.rand(16, 16, 3)
    noisy = (gt + 0.2 * torch.randn_like(gt)).clamp(0, 1)
    m = M.ViewMetrics(lpips=False)
    m.update(noisy, gt, view=3)
    m.update(gt, gt, view=1)
    m.update(gt, gt, view=1)  # a distributed sampler pads ranks by repeating views
    out = m.compute()
    assert out["views"].tolist() == [1, 3]
    ssim = out["per_view"]["ssim"]
    assert float(ssim[0]) == pytest.approx(1.0, abs=1e-6) and float(ssim[1]) < 0.9
    assert float(out["ssim"]) == pytest.approx(float(ssim.mean()))
    assert math.isinf(float(out["per_view"]["psnr"][0]))  # identical image
    table = M.per_view_table(out, names=["a.png", "b.png", "c.png", "d.png"])
    assert table["view"] == [1, 3] and table["image"] == ["b.png", "d.png"] and table["psnr"][0] is None


def test_a_single_view_gives_a_one_row_table() -> None:
    m = M.ViewMetrics(lpips=False)
    m.update(*_image(0.5, 0.1), view=4)
    out = m.compute()
    assert float(out["psnr"]) == pytest.approx(20.0, abs=1e-4)
    table = M.per_view_table(out, names=[f"{i}.png" for i in range(5)])
    assert (
        table["view"] == [4]
        and table["image"] == ["4.png"]
        and table["psnr"] == [pytest.approx(20.0, abs=1e-4)]
    )


def test_compute_without_views_and_bad_shapes_are_errors() -> None:
    m = M.ViewMetrics(lpips=False)
    with pytest.raises(RuntimeError, match="no view was evaluated"):
        m.compute()
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        m.update(torch.zeros(4, 4, 3), torch.zeros(4, 3, 3), view=0)


def test_lpips_skipped_with_one_line_when_weights_are_missing(monkeypatch, caplog, tmp_path: Path) -> None:
    monkeypatch.setattr(M, "_lpips_cache", {})
    monkeypatch.setattr(M, "lpips_weights_path", lambda net="vgg": tmp_path / "vgg16-397923af.pth")
    with caplog.at_level(logging.INFO, logger=M.__name__):
        first = M.ViewMetrics()
        second = M.ViewMetrics(lpips="vgg")
    assert not first.has_lpips and not second.has_lpips
    lines = [r.getMessage() for r in caplog.records if "LPIPS" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path / "vgg16-397923af.pth") in lines[0]
    monkeypatch.setattr(M, "_lpips_cache", {})
    monkeypatch.setattr(M, "lpips_weights_path", lambda net="vgg": "torchvision is not installed")
    with caplog.at_level(logging.INFO, logger=M.__name__):
        assert M.load_lpips("alex") is None
    assert "LPIPS skipped: torchvision is not installed" in caplog.text


def test_lpips_net_names_are_checked() -> None:
    with pytest.raises(ValueError, match="LPIPS net must be one of"):
        M.lpips_weights_path("resnet")


def test_scores_are_float32_under_a_mixed_precision_autocast() -> None:
    """bf16-mixed runs validate under autocast: the scores must equal the float32 ones."""
    gen = torch.Generator().manual_seed(3)
    target = torch.rand(48, 40, 3, generator=gen)
    pred = (target + 0.03 * torch.randn(48, 40, 3, generator=gen)).clamp(0, 1)
    p, t = pred.permute(2, 0, 1)[None], target.permute(2, 0, 1)[None]
    expected = {  # float32, outside any autocast
        "psnr": peak_signal_noise_ratio(p, t, data_range=1.0),
        "ssim": structural_similarity_index_measure(p, t, data_range=1.0),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = M.ViewMetrics(lpips=False).score(pred, target)
        assert abs(structural_similarity_index_measure(p, t, data_range=1.0) - expected["ssim"]) > 5e-6
    for name in ("psnr", "ssim"):
        assert mixed[name].dtype == torch.float32
        torch.testing.assert_close(mixed[name], expected[name], rtol=0, atol=1e-6, msg=name)


def test_ngp_composite_is_the_image_over_black_in_linear_rgb() -> None:
    """instant-ngp's run.py metric composites over black in linear RGB: straight sRGB colour 0.5 at
    opacity 0.5 (0.75 over white) is linear 0.21404 * 0.5 -> sRGB 0.36078 (IEC 61966-2-1 by hand), not
    the 0.25 of compositing in sRGB; an opaque pixel keeps its colour, a transparent one is black."""
    white = torch.ones(3)
    rgb = torch.tensor([[0.75, 0.75, 0.75], [0.3, 0.6, 0.9], [1.0, 1.0, 1.0]])
    alpha = torch.tensor([0.5, 1.0, 0.0])
    out = M.ngp_composite(rgb, alpha, white)
    torch.testing.assert_close(out[0], torch.full((3,), 0.36078), rtol=0, atol=2e-5)
    torch.testing.assert_close(out[1], rgb[1], rtol=0, atol=2e-6)
    torch.testing.assert_close(out[2], torch.zeros(3), rtol=0, atol=0)
    # composited over another background, the same straight colour gives the same image
    grey = torch.full((3,), 0.2)
    over_grey = M.ngp_composite(torch.full((1, 3), 0.35), torch.tensor([0.5]), grey)
    torch.testing.assert_close(over_grey[0], out[0])


def test_psnr_ngp_scores_the_pairs_it_is_given() -> None:
    """``psnr_ngp`` is the mean per-image PSNR of the (prediction, ground truth) pairs passed as ``ngp``
    and is reported next to, not instead of, ``psnr``."""
    m = M.ViewMetrics(lpips=False)
    a, b = _image(0.5, 0.1), _image(0.5, 0.01)  # 20 dB and 40 dB
    m.update(*a, view=0, ngp=_image(0.2, 0.01))  # 40 dB
    m.update(*b, view=1, ngp=_image(0.2, 0.001))  # 60 dB
    out = m.compute()
    assert float(out["psnr"]) == pytest.approx(30.0, abs=1e-3)
    assert float(out["psnr_ngp"]) == pytest.approx(50.0, abs=1e-2)
    table = M.per_view_table(out)
    assert table["psnr_ngp"] == pytest.approx([40.0, 60.0], abs=1e-2)
    m.update(*a, view=2)  # a view without the pair: no psnr_ngp for the pass (not a mean of some views)
    out = m.compute()
    assert "psnr_ngp" not in out and out["views"].tolist() == [0, 1, 2]


def test_srgb_over_black_is_the_straight_colour_times_alpha() -> None:
    """Over black in sRGB (NeRF's compositing; the ground truth of instant-ngp's run.py with
    --nerf_compatibility): straight sRGB colour 0.5 at opacity 0.5 (0.75 over white) is 0.25, not the
    0.36078 of compositing in linear RGB; an opaque pixel keeps its colour, a transparent one is black."""
    white = torch.ones(3)
    rgb = torch.tensor([[0.75, 0.75, 0.75], [0.3, 0.6, 0.9], [1.0, 1.0, 1.0]])
    alpha = torch.tensor([0.5, 1.0, 0.0])
    out = M.srgb_over_black(rgb, alpha, white)
    torch.testing.assert_close(out[0], torch.full((3,), 0.25), rtol=0, atol=1e-7)
    torch.testing.assert_close(out[1], rgb[1], rtol=0, atol=1e-7)
    torch.testing.assert_close(out[2], torch.zeros(3), rtol=0, atol=0)
    # a faint floater over white (opacity 0.01 of white) is 0.01 over black here, 0.0998 in linear RGB
    faint = (torch.ones(1, 3), torch.tensor([0.01]), white)
    assert float(M.srgb_over_black(*faint)[0, 0]) == pytest.approx(0.01, abs=1e-6)
    assert float(M.ngp_composite(*faint)[0, 0]) == pytest.approx(0.0998, abs=1e-3)


def test_psnr_black_scores_its_pairs_beside_psnr_ngp() -> None:
    """``psnr_black`` is the mean per-image PSNR of the pairs passed as ``black``, kept apart from
    ``psnr_ngp``."""
    m = M.ViewMetrics(lpips=False)
    m.update(*_image(0.5, 0.1), view=0, ngp=_image(0.2, 0.01), black=_image(0.3, 0.1))  # 40, 20 dB
    m.update(*_image(0.5, 0.1), view=1, ngp=_image(0.2, 0.01), black=_image(0.3, 0.001))  # 40, 60 dB
    out = m.compute()
    assert float(out["psnr_ngp"]) == pytest.approx(40.0, abs=1e-2)
    assert float(out["psnr_black"]) == pytest.approx(40.0, abs=1e-2)
    assert M.per_view_table(out)["psnr_black"] == pytest.approx([20.0, 60.0], abs=1e-2)
