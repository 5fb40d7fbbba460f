"""Masks of what moved: which pixels of a view may train and score, and the table the samplers draw from.

Two conventions are read (``data/mask_files.py`` finds the files):

- ``mask_path`` of a frame (nerfstudio): a single-channel image, **0 = ignore, nonzero = keep**
  (nerfstudio reads it as a boolean "keep" image). ``process masks=FOLDER`` writes these.
- ``dynamic_mask_<image stem>.png`` beside the image (instant-ngp, ``nerf_loader.cu``): **nonzero =
  ignore** (any non-zero R, G or B channel marks the pixel as dynamic, left out of training).

Decoded, a mask is ``keep``: bool [H, W], True where the pixel trains and scores. Downscaling
(``data.downscale=K``) keeps a small pixel only when **every** pixel of its K x K block is kept (one
ignored pixel ignores the block: an occluder's edge never leaks into training), cropped as the image
is. Decoded masks go through the image cache (``data/images.py``), keyed by the mask file's bytes,
the convention and the factor.

:class:`KeptPixels` is what a sampler needs of the training views' masks: per view the number of
kept pixels and, for the views with a mask, the row-major indices of the kept pixels. A draw then
picks the view from the sampler's CDF (whose probabilities follow the kept counts) and one of the
view's kept pixels uniformly, so a masked pixel has probability zero. Captures without masks have no
table and draw as before (no per-ray work).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nerf_lightning.data.images import cache_path, default_cache_dir, read_capture_file, through_cache
from nerf_lightning.data.transforms_json import CaptureError
from nerf_lightning.data.types import Frame

__all__ = ["MASK_KINDS", "KeptPixels", "decode_mask", "downscale_keep", "load_masks"]

#: ``keep``: nonzero pixels are kept (nerfstudio ``mask_path``); ``dynamic``: nonzero pixels are ignored
#: (instant-ngp ``dynamic_mask_*.png``)
MASK_KINDS = ("keep", "dynamic")


def decode_mask(data: bytes, kind: str, name: str | Path) -> np.ndarray:
    """A mask file's bytes -> keep, bool [H, W] (``kind``: one of :data:`MASK_KINDS`)."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            arr = np.asarray(im.convert("RGB") if im.mode not in ("L", "1", "I", "I;16") else im)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise CaptureError(f"{name}: cannot decode mask ({e}); expected a complete PNG file") from e
    nonzero = (arr != 0).any(axis=2) if arr.ndim == 3 else arr != 0
    return ~nonzero if kind == "dynamic" else nonzero


def downscale_keep(keep: np.ndarray, factor: int) -> np.ndarray:
    """bool [H, W] -> [H // factor, W // factor]: a block is kept only when all its pixels are."""
    if factor == 1:
        return keep
    h2, w2 = keep.shape[0] // factor, keep.shape[1] // factor
    return keep[: h2 * factor, : w2 * factor].reshape(h2, factor, w2, factor).all(axis=(1, 3))


def _load_one(path: Path, kind: str, downscale: int, cache_dir: Path | None) -> np.ndarray:
    data = read_capture_file(path, "mask")
    entry = None
    if cache_dir is not None:
        digest = hashlib.blake2b(data + kind.encode(), digest_size=20).hexdigest()
        entry = cache_path(cache_dir, f"mask-{digest}", downscale)
    return through_cache(
        entry,
        lambda: np.ascontiguousarray(downscale_keep(decode_mask(data, kind, path), downscale)),
        lambda arr: arr.dtype == np.bool_ and arr.ndim == 2,
        path,
    )


def load_masks(
    frames: Sequence[Frame],
    downscale: int = 1,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
    num_workers: int | None = None,
) -> list[np.ndarray | None] | None:
    """Each frame's keep mask, bool [H, W] after downscaling (None for a frame without one); None when
    no frame has a mask. ``num_workers`` is accepted for the image loader's keywords and unused."""
    if not any(f.mask_path is not None for f in frames):
        return None
    cdir = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if use_cache else None
    out: list[np.ndarray | None] = []
    for f in frames:
        if f.mask_path is None:
            out.append(None)
            continue
        keep = _load_one(Path(f.mask_path), f.mask_kind, downscale, cdir)
        size = (f.intrinsics.height, f.intrinsics.width)
        if keep.shape != size:
            raise CaptureError(
                f"{f.mask_path}: mask is {keep.shape[1]}x{keep.shape[0]} (after data.downscale={downscale}) "
                f"but its image {Path(f.image_path).name} is {size[1]}x{size[0]}; a mask must have its "
                "image's size"
            )
        out.append(keep)
    return out


def packed_keep(masks: list[np.ndarray | None] | None, counts: Sequence[int]) -> Tensor | None:
    """The views' keep masks packed as their pixels are (``data/images.py``), bool [P]; views without a
    mask are all kept. None without masks."""
    if masks is None:
        return None
    parts = [
        torch.ones(int(n), dtype=torch.bool) if m is None else torch.from_numpy(m.reshape(-1))
        for m, n in zip(masks, counts, strict=True)
    ]
    return torch.cat(parts)


@dataclass
class KeptPixels:
    """The training views' kept pixels, as a draw needs them.

    Attributes:
        counts: int64 [V], kept pixels of each view (its pixel count when it has no mask).
        starts: int64 [V], where a masked view's kept pixels start in ``index``; -1 for a view without
            a mask (all its pixels are kept: pixel ``j`` is row-major pixel ``j``).
        index: int32 [K], the row-major pixel indices of the masked views' kept pixels.
    """

    counts: Tensor
    starts: Tensor
    index: Tensor

    @classmethod
    def of_masks(cls, masks: Sequence[np.ndarray | None], widths: Sequence[int], heights: Sequence[int]):
        """The table of keep masks (None: a view without a mask, all ``w * h`` pixels kept)."""
        counts, starts, parts, at = [], [], [], 0
        for m, w, h in zip(masks, widths, heights, strict=True):
            if m is None:
                counts.append(int(w) * int(h))
                starts.append(-1)
                continue
            kept = np.flatnonzero(m.reshape(-1)).astype(np.int32)
            counts.append(len(kept))
            starts.append(at)
            parts.append(kept)
            at += len(kept)
        index = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dtype=torch.int32)
        if index.numel() == 0:  # every masked view is wholly masked: one dummy entry keeps gathers in range
            index = torch.zeros(1, dtype=torch.int32)
        return cls(torch.tensor(counts, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64), index)

    def to(self, device: torch.device | str) -> KeptPixels:
        return KeptPixels(self.counts.to(device), self.starts.to(device), self.index.to(device))

    def subset(self, views: Tensor) -> KeptPixels:
        """The table of ``views`` (int64 [V_r], global ids), indexed by their position in it."""
        v = views.to(self.counts.device)
        return KeptPixels(self.counts[v], self.starts[v], self.index)

    @property
    def device(self) -> torch.device:
        return self.counts.device

    def pixels(self, view_ids: Tensor, u: Tensor, widths: Tensor) -> tuple[Tensor, Tensor]:
        """(px, py) int64 of one kept pixel of each view ``view_ids`` at uniform fraction ``u`` float64 [n]
        of its kept pixels; ``widths``: the views' widths, int64 [V]."""
        n = self.counts[view_ids]
        j = torch.minimum((u * n).long(), (n - 1).clamp_min(0))
        start = self.starts[view_ids]
        listed = self.index[(start.clamp_min(0) + j).clamp_max(self.index.numel() - 1)].long()
        flat = torch.where(start >= 0, listed, j)
        w = widths[view_ids]
        return flat % w, torch.div(flat, w, rounding_mode="floor")
