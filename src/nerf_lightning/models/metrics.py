"""Held-out image metrics as instant-ngp, nerfacc and torch-ngp report them.

Every metric is computed **per image** and then averaged over the views: held-out PSNR is the mean
of the per-image PSNRs (not the PSNR of the MSE pooled over all pixels, which weights large and
badly reconstructed images differently), SSIM the mean of per-image SSIMs (torchmetrics' Gaussian
11x11 window), and LPIPS the mean of per-image LPIPS when its network weights are on this machine.

``psnr_ngp`` is instant-ngp's own number (``scripts/run.py --test_transforms``), for side-by-side
tables: prediction and ground truth each composited over black in *linear* RGB, converted to sRGB and
clipped to [0, 1] (:func:`ngp_composite`), MSE over pixels and channels, per-image PSNR, mean over the
views. On opaque captures it differs from ``psnr`` only where the prediction is not opaque (black
shows through instead of the evaluation background); on RGBA renders it scores the object over black.
The headline ``psnr`` stays the nerfacc convention: the prediction composited over the evaluation
background in sRGB against the image composited the same way.

Masks (``data/masks.py``): on a view with a mask, every PSNR (``psnr``, ``psnr_ngp``, ``psnr_black``)
is the MSE over its kept pixels only, and SSIM and LPIPS see the masked pixels of the prediction
replaced by the ground truth's (they score windows, not pixels), so what moved in front of the
camera neither lowers nor raises the view's number beyond its border.

``psnr_black`` is the same over black: the straight sRGB colour times the opacity, against the image's
sRGB colour times its alpha (:func:`srgb_over_black`). Its ground truth is the one instant-ngp's
``run.py --test_transforms --nerf_compatibility`` scores against, the mode of instant-ngp's published
NeRF-synthetic numbers: with ``--nerf_compatibility`` instant-ngp works in sRGB and composites the test
image over black in sRGB (``overlay_image`` in ``render_buffer.cu``), not in linear RGB as
``psnr_ngp`` (its default mode) does. The two differ only at partly transparent pixels, where
``psnr_ngp`` charges faint opacity far more (an opacity of 0.01 over black reads 0.10 after sRGB).

LPIPS needs ``torchvision`` and the backbone's ImageNet weights in the torch hub cache
(``torch.hub.get_dir()/checkpoints``); they are never downloaded during a run. When either is
missing, LPIPS is skipped with one log line per process.

:class:`ViewMetrics` accumulates the per-view values of one evaluation pass in torchmetrics list
states, so under DDP every rank's views are gathered before the mean (views a distributed sampler
repeated to even out the ranks are counted once).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure
from torchmetrics.utilities import dim_zero_cat

__all__ = [
    "LPIPS_NETS",
    "METRICS",
    "ViewMetrics",
    "final_evaluation",
    "linear_to_srgb",
    "load_lpips",
    "lpips_weights_path",
    "ngp_composite",
    "per_view_table",
    "srgb_over_black",
    "srgb_to_linear",
]

log = logging.getLogger(__name__)

#: torchmetrics' LPIPS ``net_type`` -> torchvision weights enum (the backbone it loads)
LPIPS_NETS = {"vgg": "VGG16_Weights", "alex": "AlexNet_Weights", "squeeze": "SqueezeNet1_1_Weights"}

#: the per-view metrics :class:`ViewMetrics` keeps (``lpips`` when its weights are local, ``psnr_ngp``
#: when the update gets instant-ngp's images)
METRICS = ("psnr", "ssim", "lpips", "psnr_ngp", "psnr_black")

_lpips_cache: dict[str, nn.Module | None] = {}


def srgb_to_linear(x: Tensor) -> Tensor:
    """The sRGB decoding curve (IEC 61966-2-1), elementwise on values in [0, 1]."""
    return torch.where(x <= 0.04045, x / 12.92, ((x.clamp_min(0.0) + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(x: Tensor) -> Tensor:
    """The sRGB encoding curve (IEC 61966-2-1), elementwise; instant-ngp's ``linear_to_srgb``."""
    return torch.where(x > 0.0031308, 1.055 * x.clamp_min(0.0) ** (1.0 / 2.4) - 0.055, 12.92 * x)


def ngp_composite(rgb: Tensor, alpha: Tensor, background: Tensor) -> Tensor:
    """An image as instant-ngp's ``run.py`` scores it: over black in linear RGB, then sRGB in [0, 1].

    Args:
        rgb: [..., 3] sRGB colour composited over ``background`` (a prediction, or an RGBA image's
            colour over the evaluation background), in [0, 1].
        alpha: [...] opacity of each pixel (the rendered opacity, or the image's alpha).
        background: [3] (or broadcastable) sRGB colour ``rgb`` was composited over.

    Returns:
        [..., 3] ``linear_to_srgb(srgb_to_linear(c) * alpha)`` clipped to [0, 1], where ``c`` is the
        straight (un-premultiplied) sRGB colour, clipped to [0, 1] (0 where ``alpha`` is ~0).
    """
    a = alpha.float().clamp(0.0, 1.0)[..., None]
    premultiplied = rgb.float() - (1.0 - a) * background.float()
    straight = torch.where(a > 1e-6, premultiplied / a.clamp_min(1e-6), torch.zeros_like(premultiplied))
    return linear_to_srgb(srgb_to_linear(straight.clamp(0.0, 1.0)) * a).clamp(0.0, 1.0)


def srgb_over_black(rgb: Tensor, alpha: Tensor, background: Tensor) -> Tensor:
    """An image over black in sRGB: NeRF's compositing, and the ground truth of instant-ngp's ``run.py``
    in its ``--nerf_compatibility`` mode.

    Args:
        rgb: [..., 3] sRGB colour composited over ``background`` (a prediction, or an RGBA image's
            colour over the evaluation background), in [0, 1].
        alpha: [...] opacity of each pixel (the rendered opacity, or the image's alpha).
        background: [3] (or broadcastable) sRGB colour ``rgb`` was composited over.

    Returns:
        [..., 3] ``c * alpha`` (the premultiplied sRGB colour ``rgb - (1 - alpha) * background``),
        clipped to [0, 1].
    """
    a = alpha.float().clamp(0.0, 1.0)[..., None]
    return (rgb.float() - (1.0 - a) * background.float()).clamp(0.0, 1.0)


def lpips_weights_path(net: str = "vgg") -> Path | str:
    """Where torchvision keeps the LPIPS backbone weights of ``net``, or why they cannot be there.

    Returns:
        the weights file path (it may not exist), or a string saying what is missing (torchvision).
    """
    if net not in LPIPS_NETS:
        raise ValueError(f"LPIPS net must be one of {sorted(LPIPS_NETS)}, got {net!r}")
    try:
        import torchvision
    except ImportError:
        return "torchvision is not installed"
    weights = getattr(torchvision.models, LPIPS_NETS[net]).DEFAULT
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)


def load_lpips(net: str = "vgg") -> nn.Module | None:
    """torchmetrics' LPIPS scorer (inputs in [0, 1]) if its weights are local, else None (logged once).

    One scorer per process and ``net``: it is shared by every :class:`ViewMetrics` and kept out of the
    LightningModule's parameters, so checkpoints never contain it.
    """
    if net in _lpips_cache:
        return _lpips_cache[net]
    where = lpips_weights_path(net)
    scorer = None
    if isinstance(where, str):
        log.info("LPIPS skipped: %s", where)
    elif not where.is_file():
        log.info("LPIPS skipped: backbone weights not found at %s (torchvision's %s download)", where, net)
    else:
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        scorer = LearnedPerceptualImagePatchSimilarity(net_type=net, normalize=True).eval()
        scorer.requires_grad_(False)
    _lpips_cache[net] = scorer
    return scorer


class ViewMetrics(Metric):
    """Per-view PSNR / SSIM (/ LPIPS) of one evaluation pass, and their means.

    Args:
        lpips: ``None`` (LPIPS when its weights are local), ``False`` (never), or a net name
            (``vgg`` like nerfacc, ``alex``, ``squeeze``; skipped when its weights are missing).

    ``update(pred, target, view[, ngp][, black])`` takes one whole image: ``pred`` and ``target`` float
    [H, W, 3] in [0, 1] (``pred`` is clamped), ``view`` its index in the evaluated split, ``ngp`` the
    pair (prediction, ground truth) as :func:`ngp_composite` makes them, for ``psnr_ngp``, and ``black``
    the pair as :func:`srgb_over_black` makes them, for ``psnr_black``.
    ``compute()`` returns ``{"psnr", "ssim"[, "lpips"][, "psnr_ngp"][, "psnr_black"]}`` means over the
    distinct views (0-dim tensors), plus ``"views"`` (int64 [V], sorted) and ``"per_view"`` (dict of
    float [V] tensors in the same order); with a single view torchmetrics squeezes those to 0-dim, so
    read them with ``.reshape(-1)``.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, lpips: bool | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        net = "vgg" if lpips in (None, True) else lpips
        # A module in a plain list: not a submodule, so not in state dicts or parameter lists.
        self._lpips = [load_lpips(net)] if net else [None]
        for name in ("views", *METRICS):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    @property
    def has_lpips(self) -> bool:
        return self._lpips[0] is not None

    def score(self, pred: Tensor, target: Tensor, keep: Tensor | None = None) -> dict[str, Tensor]:
        """The metrics of one image, 0-dim tensors (``psnr``, ``ssim``[, ``lpips``]); stores nothing.

        Args:
            pred: float [H, W, 3] in [0, 1] (clamped).
            target: float [H, W, 3] in [0, 1].
            keep: bool [H, W], the pixels that score (a mask); None: all.
        """
        if pred.shape != target.shape or pred.dim() != 3 or pred.shape[-1] != 3:
            raise ValueError(
                f"ViewMetrics: pred and target must both be [H, W, 3], got "
                f"{tuple(pred.shape)} and {tuple(target.shape)}"
            )
        if keep is not None:
            pred = torch.where(keep[..., None], pred.detach().float(), target.detach().float())
        p = pred.detach().float().clamp(0, 1).permute(2, 0, 1)[None]
        t = target.detach().float().permute(2, 0, 1)[None]
        # In float32 whatever the run's precision: under bf16/16-mixed autocast, SSIM's Gaussian
        # convolutions would run in half precision (lego: 0.920 instead of 0.954 for the same image).
        with torch.autocast(p.device.type, enabled=False):
            values = {
                "psnr": _psnr(p[0].permute(1, 2, 0), t[0].permute(1, 2, 0), keep),
                "ssim": structural_similarity_index_measure(p, t, data_range=1.0),
            }
            scorer = self._lpips[0]
            if scorer is not None:
                scorer.to(p.device)
                values["lpips"] = scorer(p, t)
                scorer.reset()
        return values

    def update(  # type: ignore[override]
        self,
        pred: Tensor,
        target: Tensor,
        view: int,
        ngp: tuple[Tensor, Tensor] | None = None,
        black: tuple[Tensor, Tensor] | None = None,
        keep: Tensor | None = None,
    ) -> None:
        """Score one whole image (see :meth:`score`) as view ``view`` of the evaluated split; ``ngp``:
        also ``psnr_ngp`` of the (prediction, ground truth) pair, both [H, W, 3] from
        :func:`ngp_composite`; ``black``: ``psnr_black`` of the pair from :func:`srgb_over_black`;
        ``keep``: bool [H, W], the pixels that score (a mask), None: all."""
        values = self.score(pred, target, keep)
        with torch.autocast(pred.device.type, enabled=False):
            for name, pair in (("psnr_ngp", ngp), ("psnr_black", black)):
                if pair is not None:
                    values[name] = _psnr(pair[0].float(), pair[1].float(), keep)
        self.views.append(torch.tensor([int(view)], device=pred.device))
        for name, value in values.items():
            getattr(self, name).append(value.reshape(1).float())

    def compute(self) -> dict[str, Any]:
        # list states on one process; one tensor each once torchmetrics has gathered them under DDP
        views = _cat(self.views)
        if views is None or views.numel() == 0:
            raise RuntimeError("ViewMetrics.compute: no view was evaluated (empty split?)")
        order = torch.argsort(views, stable=True)
        views = views[order]
        first = torch.ones_like(views, dtype=torch.bool)
        first[1:] = views[1:] != views[:-1]  # a distributed sampler may repeat views: keep one
        out: dict[str, Any] = {"views": views[first], "per_view": {}}
        for name in METRICS:
            state = _cat(getattr(self, name))
            if state is None or state.numel() != order.numel():
                continue  # not scored (no LPIPS weights, no ngp pairs), or not for every view
            values = state[order][first]
            out["per_view"][name] = values
            out[name] = values.mean()
        return out


def _psnr(pred: Tensor, target: Tensor, keep: Tensor | None) -> Tensor:
    """PSNR (data range 1) of [H, W, 3] images over all pixels, or over the ``keep`` [H, W] ones."""
    if keep is None:
        return peak_signal_noise_ratio(pred, target, data_range=1.0)
    err = ((pred - target) ** 2)[keep]
    return -10.0 * torch.log10(err.mean())


def _cat(state: Tensor | list[Tensor]) -> Tensor | None:
    """A list state as one tensor (None when empty); a gathered state as it is."""
    if isinstance(state, Tensor):
        return state.reshape(-1)
    return dim_zero_cat(state).reshape(-1) if state else None


def per_view_table(result: dict[str, Any], names: list[str] | None = None) -> dict[str, list]:
    """JSON-ready per-view numbers of a :meth:`ViewMetrics.compute` result: ``view`` (index in the
    split), ``image`` (file names, when ``names`` indexes the split's frames) and one list per metric."""
    # reshape: torchmetrics squeezes one-element results of compute() to 0-dim tensors
    views = [int(v) for v in result["views"].reshape(-1)]
    table: dict[str, list] = {"view": views}
    if names is not None:
        table["image"] = [names[v] for v in views]
    for name, values in result["per_view"].items():
        table[name] = [round(float(x), 6) if math.isfinite(float(x)) else None for x in values.reshape(-1)]
    return table


def final_evaluation(trainer: Any, model: Any, datamodule: Any) -> dict[str, Any]:
    """The ``metrics.json`` entries of a finished run's evaluation, after ``trainer.validate``.

    Runs ``trainer.test`` on the datamodule's final-evaluation views (its ``test_dataloader``: the
    capture's test split, else all held-out views) unless validation already rendered exactly those.

    Returns:
        ``val/per_view`` (and ``test/*`` with ``test/per_view`` when the test stage ran), plus the
        headline ``eval/psnr``, ``eval/ssim`` (``eval/lpips``, ``eval/psnr_ngp``) and ``eval/split``
        (``"test"`` or ``"val"``): the split the final numbers come from; ``eval/views`` the images
        scored, ``eval/n_views`` their number of the split's ``eval/n_split_views``
        (``data.max_test_views`` thins them). When the held-out fit ran (``models/heldout_fit.py``),
        also ``eval/psnr_fitted`` ... and ``*_fitted`` per-view columns.
    """
    out: dict[str, Any] = {}
    results = model.eval_results
    if "val" in results:
        out["val/per_view"] = _with_fitted(
            per_view_table(results["val"], _names(datamodule.val_set)), results, "val"
        )
    scored = _names(datamodule.test_set) or []
    capture = datamodule.capture
    out["eval/views"] = scored
    out["eval/n_views"] = len(scored)
    of = out["eval/n_split_views"] = len(capture.test or capture.val) if capture is not None else len(scored)
    if getattr(trainer, "is_global_zero", True):
        limit = getattr(datamodule, "max_test_views", None)
        thinned = f" (data.max_test_views={limit}; null: all)" if len(scored) < of else ""
        log.info(
            "final evaluation: %d of %d %s views%s: %s",
            len(scored), of, datamodule.eval_split, thinned, ", ".join(scored),
        )  # fmt: skip
    stage = "val"
    if datamodule.test_set is not datamodule.val_set:
        tested = trainer.test(model, datamodule=datamodule, verbose=False)
        out.update({k: float(v) for k, v in (tested[0] if tested else {}).items()})
        out["test/per_view"] = _with_fitted(
            per_view_table(results["test"], _names(datamodule.test_set)), results, "test"
        )
        stage = "test"
    for name in METRICS:
        if stage in results and name in results[stage]:
            out[f"eval/{name}"] = float(results[stage][name])
        fitted = results.get(f"{stage}_fitted", {})
        if name in fitted:
            out[f"eval/{name}_fitted"] = float(fitted[name])
    out["eval/split"] = datamodule.eval_split
    return out


def _with_fitted(table: dict[str, list], results: dict[str, Any], stage: str) -> dict[str, list]:
    """The per-view table with the fair protocol's columns (``psnr_fitted`` ...) when it ran."""
    if f"{stage}_fitted" in results:
        fitted = per_view_table(results[f"{stage}_fitted"])
        if fitted["view"] == table["view"]:
            table.update({f"{k}_fitted": v for k, v in fitted.items() if k != "view"})
    return table


def _names(view_set: Any) -> list[str] | None:
    frames = getattr(view_set, "frames", None)
    return None if frames is None else [Path(f.image_path).name for f in frames]
