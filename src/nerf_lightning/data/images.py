"""Image decoding, integer downscaling and a content-addressed uint8 cache.

``load_images`` turns a list of frames into one packed uint8 tensor of pixels (all views
concatenated, row-major), which the DataModule moves to the training device once.

Pixels are used as stored: an EXIF orientation tag is not applied, as instant-ngp (stb_image) does
not apply it, so the image matches the ``w``/``h`` and principal point the camera solve wrote.

Cache: one ``.npy`` per (image file content, downscale) under ``cache_dir`` (default
``$NERF_LIGHTNING_CACHE`` or ``~/.cache/nerf_lightning/images``), named by the BLAKE2b digest of
the file bytes, so renamed or copied captures hit the cache and edited images miss it. Entries are
written atomically (temporary file + ``os.replace``), so concurrent runs can share a cache. An entry is
used only when it holds a uint8 image of the size its file's header gives at that downscale; any other
(corrupt, stale, foreign) is decoded again and replaced, with a warning.

Run ``python -m nerf_lightning.data.images CAPTURE --downscale K`` to time cold vs cached loading.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nerf_lightning.data.transforms_json import CaptureError, too_large_message
from nerf_lightning.data.types import Frame

__all__ = [
    "ImageSet",
    "cache_path",
    "decode_image",
    "default_cache_dir",
    "downscale_image",
    "load_images",
    "read_cached",
    "read_capture_file",
    "through_cache",
    "write_cached",
]

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: RGBA blocks averaged with premultiplied colour


@dataclass
class ImageSet:
    """All views' pixels packed into one tensor.

    Attributes:
        pixels: [P, C] uint8, views concatenated, each view row-major (pixel (i, j) of view v is
            row ``offsets[v] + j * widths[v] + i``).
        offsets: [V] int64 index of each view's first pixel in ``pixels``.
        widths, heights: [V] int64 image sizes after downscaling.
        channels: C, 3 (RGB) or 4 (RGBA; views without alpha get alpha 255).
    """

    pixels: torch.Tensor
    offsets: torch.Tensor
    widths: torch.Tensor
    heights: torch.Tensor
    channels: int

    @property
    def num_views(self) -> int:
        return int(self.offsets.shape[0])

    def view(self, index: int) -> torch.Tensor:
        """[H, W, C] uint8 image of view ``index`` (a view into ``pixels``)."""
        w, h = int(self.widths[index]), int(self.heights[index])
        start = int(self.offsets[index])
        return self.pixels[start : start + w * h].view(h, w, self.channels)


def default_cache_dir() -> Path:
    """``$NERF_LIGHTNING_CACHE`` if set, else ``~/.cache/nerf_lightning/images``."""
    env = os.environ.get("NERF_LIGHTNING_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "nerf_lightning" / "images"


def decode_image(data: bytes, name: str | Path) -> np.ndarray:
    """Decode PNG/JPEG bytes to [H, W, 3] or [H, W, 4] uint8 (alpha kept only if the file has it).

    Raises:
        CaptureError: naming ``name`` when the bytes are not a readable (complete) image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            alpha = "A" in im.getbands() or "transparency" in im.info
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                # 16-bit greyscale: keep the high byte rather than clipping at 255.
                arr = (np.asarray(im, dtype=np.uint32) >> 8).astype(np.uint8)
                return np.repeat(arr[:, :, None], 3, axis=2)
            arr = np.asarray(im.convert("RGBA" if alpha else "RGB"))
    except Image.DecompressionBombError as e:
        raise CaptureError(too_large_message(name, e)) from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise CaptureError(f"{name}: cannot decode image ({e}); expected a complete PNG or JPEG file") from e
    return np.ascontiguousarray(arr, dtype=np.uint8)


def downscale_image(img: np.ndarray, factor: int) -> np.ndarray:
    """Area-average downscale of [H, W, C] uint8 by an integer factor (cropped to a multiple of it).

    Returns:
        [H // factor, W // factor, C] uint8, each pixel the rounded mean of a factor x factor block.
    """
    if factor == 1:
        return img
    h, w, c = img.shape
    h2, w2 = h // factor, w // factor
    if c == 4:
        return _downscale_rgba(img[: h2 * factor, : w2 * factor], factor)
    blocks = img[: h2 * factor, : w2 * factor].reshape(h2, factor, w2, factor, c)
    # Sum columns then rows with a loop over the block offset (not over pixels): strided numpy
    # reductions over small axes are ~4x slower. uint16 holds factor * 255 for factor <= 257.
    cols = blocks[:, :, :, 0].astype(np.uint16 if factor <= 257 else np.uint32)  # [h2, factor, w2, c]
    for j in range(1, factor):
        cols += blocks[:, :, :, j]
    cols32 = cols.astype(np.uint32)
    total = cols32[:, 0].copy()  # [h2, w2, c]
    for i in range(1, factor):
        total += cols32[:, i]
    n = factor * factor
    return ((total + n // 2) // n).astype(np.uint8)


def _downscale_rgba(img: np.ndarray, factor: int) -> np.ndarray:
    """:func:`downscale_image` of an RGBA image whose sides are multiples of ``factor``."""
    h2, w2 = img.shape[0] // factor, img.shape[1] // factor
    x = img.astype(np.float64).reshape(h2, factor, w2, factor, 4)
    alpha = x[..., 3:] / 255.0
    mean_alpha = alpha.mean(axis=(1, 3))  # [h2, w2, 1]
    premultiplied = (x[..., :3] * alpha).mean(axis=(1, 3))
    plain = x[..., :3].mean(axis=(1, 3))  # fully transparent blocks: any colour composites the same
    rgb = np.where(mean_alpha > 0, premultiplied / np.maximum(mean_alpha, 1e-12), plain)
    out = np.concatenate([rgb, mean_alpha * 255.0], axis=-1)
    return np.floor(out + 0.5).clip(0, 255).astype(np.uint8)


def cache_path(cache_dir: Path, digest: str, downscale: int) -> Path:
    return cache_dir / f"{digest}_x{downscale}_v{CACHE_VERSION}.npy"


#: numpy parses a .npy header with ``ast.literal_eval``, and building an AST is not thread-safe in CPython
#: 3.11 (gh-106905: concurrent parses fail with "SystemError: AST constructor recursion depth mismatch"), so
#: the loading threads map the cache entries one at a time and copy their pixels in parallel.
_NPY_HEADER_LOCK = threading.Lock()


def read_cached(path: Path) -> np.ndarray:
    with _NPY_HEADER_LOCK:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    return np.array(mapped)


def write_cached(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _decoded_size(data: bytes, downscale: int) -> tuple[int, int] | None:
    """(height, width) that decoding and downscaling ``data`` gives, from its header; None when the
    header does not say (decoding then reports the file)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
    except Exception:  # noqa: BLE001 - any unreadable header: decode_image names the file
        return None
    return height // downscale, width // downscale


def through_cache(
    entry: Path | None, decode: Callable[[], np.ndarray], usable: Callable[[np.ndarray], bool], source: Path
) -> np.ndarray:
    """The array of the cache file ``entry`` when ``usable`` accepts it, else ``decode()``, then written to
    ``entry`` atomically (a corrupt or stale entry is overwritten; a read-only or full cache is skipped: it
    must not stop training). ``entry`` None: no cache. ``source``: the decoded file, for the log."""
    if entry is not None and entry.is_file():
        try:
            arr = read_cached(entry)
        except (OSError, ValueError):
            log.debug("%s: unreadable cache entry %s; decoding again", source, entry)
        else:
            if usable(arr):
                return arr
    arr = decode()
    if entry is not None:
        try:
            write_cached(entry, arr)
        except OSError:
            pass
    return arr


def _usable_image(arr: np.ndarray, entry: Path, data: bytes, downscale: int, image: Path) -> bool:
    """Whether the cache entry ``arr`` holds ``data`` decoded at ``downscale``: a uint8 [H, W, 3|4] array of
    the header's size (a stale entry of another size is decoded again, with a warning)."""
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (3, 4):
        log.warning("%s: cache entry %s is no image (%s %s); decoding again", image, entry, arr.dtype,
                    list(arr.shape))  # fmt: skip
        return False
    expected = _decoded_size(data, downscale)
    if expected is not None and arr.shape[:2] != expected:
        log.warning(
            "%s: cache entry %s holds a %dx%d image, expected %dx%d (downscale %d); decoding again",
            image, entry, arr.shape[1], arr.shape[0], expected[1], expected[0], downscale,
        )  # fmt: skip
        return False
    return True


def read_capture_file(path: Path, what: str) -> bytes:
    """The bytes of a capture's ``what`` file (``image``, ``mask``); an unreadable one is a CaptureError
    naming it."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise CaptureError(f"{path}: cannot read {what} file ({e.strerror or e})") from e


def _load_one(path: Path, downscale: int, cache_dir: Path | None) -> np.ndarray:
    data = read_capture_file(path, "image")
    entry = None
    if cache_dir is not None:
        entry = cache_path(cache_dir, hashlib.blake2b(data, digest_size=20).hexdigest(), downscale)
    return through_cache(
        entry,
        lambda: downscale_image(decode_image(data, path), downscale),
        lambda arr: _usable_image(arr, entry, data, downscale, path),
        path,
    )


def load_images(
    frames: Sequence[Frame],
    downscale: int = 1,
    num_workers: int | None = None,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
) -> ImageSet:
    """Decode (or read from the cache) every frame's image, downscale and pack into an :class:`ImageSet`.

    Args:
        frames: views in the order they should appear in the set.
        downscale: integer factor >= 1 (area averaging, cropped to a multiple of it), matching
            ``Intrinsics.downscaled``.
        num_workers: decoding threads (PIL releases the GIL); default ``min(8, os.cpu_count())``.
        cache_dir: cache directory; default :func:`default_cache_dir`.
        use_cache: False decodes every image and writes no cache.

    Raises:
        CaptureError: an image is unreadable or truncated (names the file).
    """
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"downscale must be an integer >= 1, got {downscale!r}")
    if not frames:
        raise ValueError("load_images needs at least one frame")
    workers = num_workers or min(8, os.cpu_count() or 1)
    cdir = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if use_cache else None
    paths = [Path(f.image_path) for f in frames]
    if workers <= 1 or len(paths) == 1:
        arrays = [_load_one(p, downscale, cdir) for p in paths]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            arrays = list(pool.map(lambda p: _load_one(p, downscale, cdir), paths))
    channels = 4 if any(a.shape[2] == 4 for a in arrays) else 3
    heights = [a.shape[0] for a in arrays]
    widths = [a.shape[1] for a in arrays]
    counts = np.array([h * w for h, w in zip(heights, widths, strict=True)], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    pixels = np.empty((int(counts.sum()), channels), dtype=np.uint8)
    for a, start, n in zip(arrays, offsets, counts, strict=True):
        dst = pixels[start : start + n]
        dst[:, : a.shape[2]] = a.reshape(n, a.shape[2])
        if a.shape[2] < channels:
            dst[:, 3] = 255
    return ImageSet(
        pixels=torch.from_numpy(pixels),
        offsets=torch.from_numpy(offsets),
        widths=torch.tensor(widths, dtype=torch.int64),
        heights=torch.tensor(heights, dtype=torch.int64),
        channels=channels,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Time decoding a capture's images cold (fresh cache) and from the cache."""
    from nerf_lightning.data.formats import load_capture

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="capture directory")
    ap.add_argument("--downscale", type=int, default=1)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    cap = load_capture(args.path, downscale=args.downscale)
    frames = cap.train + cap.val + cap.test
    with tempfile.TemporaryDirectory(prefix="nerf_lightning_cache_") as tmp:
        t0 = time.perf_counter()
        s = load_images(frames, args.downscale, args.workers, cache_dir=tmp)
        t1 = time.perf_counter()
        load_images(frames, args.downscale, args.workers, cache_dir=tmp)
        t2 = time.perf_counter()
    mb = s.pixels.numel() / 2**20
    print(
        f"{len(frames)} images, downscale {args.downscale}, {s.pixels.shape[0]} pixels x {s.channels} "
        f"({mb:.1f} MiB): cold {t1 - t0:.3f} s, cached {t2 - t1:.3f} s "
        f"({(t1 - t0) / max(t2 - t1, 1e-9):.1f}x)"
    )


if __name__ == "__main__":
    main()
