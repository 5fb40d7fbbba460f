"""Frames to MP4 (imageio-ffmpeg, H.264) written atomically, and a depth colour map."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

import numpy as np

__all__ = ["VideoWriter", "depth_range", "turbo"]

# Google's polynomial fit of the Turbo colour map (Mikhailov 2019), channels as 5th-degree polynomials.
_TURBO = np.array(
    [
        [0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943],
        [0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604],
        [0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973],
    ]
)


def turbo(x: np.ndarray) -> np.ndarray:
    """Turbo colour map: values in [0, 1] [...] -> uint8 RGB [..., 3] (clipped)."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    powers = np.stack([x**i for i in range(6)], axis=-1)  # [..., 6]
    rgb = np.clip(powers @ _TURBO.T, 0.0, 1.0)
    return (rgb * 255).round().astype(np.uint8)


def depth_range(depth: np.ndarray, opacity: np.ndarray) -> tuple[float, float]:
    """Near/far of the depth colour map from an image's opaque pixels (``opacity > 0.5``): their 1st and
    99th percentiles with a 10 % margin; (0, 1) when no pixel is opaque."""
    valid = depth[opacity > 0.5]
    if valid.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(valid, [1, 99])
    margin = 0.1 * max(hi - lo, 1e-6)
    return float(max(lo - margin, 0.0)), float(hi + margin)


class VideoWriter:
    """Append uint8 RGB frames [H, W, 3]; the MP4 appears at ``path`` only when complete.

    Frames are padded to even sizes (H.264 with yuv420p needs them) by repeating the last row/column.
    The file is encoded under a temporary name in the same folder and renamed on :meth:`close`; an
    exception or a kill leaves no half-written ``path``.
    """

    def __init__(self, path: str | Path, fps: float, quality: int = 8) -> None:
        import imageio.v2 as iio2

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix}")
        self._writer = iio2.get_writer(
            self._tmp,
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            quality=quality,
            pixelformat="yuv420p",
            macro_block_size=1,
            ffmpeg_log_level="error",
        )
        self.frames = 0

    def append(self, frame: np.ndarray) -> None:
        h, w = frame.shape[:2]
        if h % 2 or w % 2:
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        self._writer.append_data(np.ascontiguousarray(frame))
        self.frames += 1

    def close(self) -> Path:
        self._writer.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
