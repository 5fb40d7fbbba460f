"""Frames from a video: about ``num_frames`` of them, the sharpest of each stretch of the clip.

The clip is decoded once by imageio-ffmpeg (its own ffmpeg binary; the rotation a phone stores in
the file is applied, so frames come out upright). Its ``N`` frames are cut into ``num_frames``
windows of consecutive frames (window ``k`` holds frames ``i`` with ``i * num_frames // N == k``);
of each window only the frame with the highest :func:`~nerf_lightning.capture.sharpness.sharpness`
(variance of the Laplacian) is kept, so that frames smeared by motion blur are dropped while the
kept frames stay spread evenly over the clip. A clip of fewer than ``num_frames`` frames keeps all
of them. ``N`` is estimated from the container's duration and frame rate (decoding just to count
would double the time); when it is off, the last windows are shorter or longer, and the count of
kept frames differs from ``num_frames`` by the error (a container without a duration is decoded
twice: once to count).

With ``downscale=K`` ffmpeg shrinks each frame by ``K`` (area filter) before anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nerf_lightning.capture.sharpness import sharpness
from nerf_lightning.errors import UserError

__all__ = ["VideoFrame", "VideoInfo", "probe_video", "extract_frames", "window_of"]

#: JPEG quality of the extracted frames (colmap2nerf asks ffmpeg for its best JPEG quality, -qscale 1)
JPEG_QUALITY = 95


@dataclass(frozen=True)
class VideoInfo:
    """What the container says: frame rate, duration (s), estimated frame count, frame size (w, h)."""

    fps: float
    duration: float
    n_frames: int
    size: tuple[int, int]


@dataclass(frozen=True)
class VideoFrame:
    """A kept frame: its file name, its index in the clip, its time (s) and its sharpness."""

    name: str
    index: int
    time: float
    sharpness: float


def _unreadable(path: Path, why: object) -> UserError:
    return UserError(
        f"video={path}: cannot read it as a video ({str(why).strip().splitlines()[0] if str(why) else why}); "
        "expected a video file ffmpeg can decode (MP4, MOV, MKV, ...)"
    )


def _open(path: Path, downscale: int):
    """imageio-ffmpeg's frame generator (rgb24) and its metadata, or a :class:`UserError`."""
    import imageio_ffmpeg

    if not path.is_file():
        raise UserError(f"video={path}: no such file")
    params = (
        [] if downscale == 1 else ["-vf", f"scale=trunc(iw/{downscale}):trunc(ih/{downscale}):flags=area"]
    )
    gen = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", output_params=params)
    try:
        meta = next(gen)
    except (OSError, RuntimeError, StopIteration, ValueError) as err:
        gen.close()
        raise _unreadable(path, err) from err
    return gen, meta


def probe_video(path: str | Path, downscale: int = 1) -> VideoInfo:
    """Frame rate, duration, estimated frame count and (downscaled) frame size of a video.

    Raises:
        UserError: the file is missing or not a video.
    """
    path = Path(path)
    gen, meta = _open(path, downscale)
    gen.close()
    return _info(path, meta)


def _info(path: Path, meta: dict) -> VideoInfo:
    fps = float(meta.get("fps") or 0.0)
    duration = float(meta.get("duration") or 0.0)
    size = tuple(int(v) for v in meta.get("size") or (0, 0))
    if size[0] <= 0 or size[1] <= 0:
        raise _unreadable(path, "no video stream")
    n = int(round(duration * fps)) if fps > 0 and duration > 0 else 0
    return VideoInfo(fps=fps, duration=duration, n_frames=n, size=(size[0], size[1]))


def window_of(index: int, n_frames: int, num_frames: int) -> int:
    """Window (0 .. num_frames - 1) of frame ``index`` of a clip of ``n_frames`` frames."""
    if n_frames <= num_frames:
        return index
    return min(num_frames - 1, index * num_frames // n_frames)


def extract_frames(
    path: str | Path,
    out_dir: str | Path,
    num_frames: int,
    downscale: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[VideoFrame], VideoInfo]:
    """Decode ``path`` and write the sharpest frame of each window to ``out_dir/frame_NNNNN.jpg``.

    Args:
        path: a video file ffmpeg can decode.
        out_dir: folder of the frames (created).
        num_frames: how many windows (about how many frames are kept); >= 1.
        downscale: integer factor >= 1 applied by ffmpeg while decoding.
        on_progress: called with (frames decoded, estimated total) as decoding goes.

    Returns:
        (the kept frames in clip order, the clip's :class:`VideoInfo`).

    Raises:
        UserError: the file is missing, not a video, or has no frame.
    """
    import imageio.v3 as iio

    path, out_dir = Path(path), Path(out_dir)
    if num_frames < 1:
        raise UserError(f"num_frames={num_frames}: expected >= 1")
    gen, meta = _open(path, downscale)
    info = _info(path, meta)
    w, h = info.size
    total = info.n_frames if info.n_frames > 0 else _count_frames(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept: list[VideoFrame] = []
    best: tuple[float, int, np.ndarray] | None = None  # (sharpness, index, pixels) of the open window
    window = -1

    def flush() -> None:
        if best is None:
            return
        score, index, pixels = best
        name = f"frame_{len(kept) + 1:05d}.jpg"
        iio.imwrite(out_dir / name, pixels, quality=JPEG_QUALITY)
        time = index / info.fps if info.fps > 0 else 0.0
        kept.append(VideoFrame(name=name, index=index, time=time, sharpness=score))

    index = -1
    try:
        for index, raw in enumerate(gen):
            pixels = np.frombuffer(raw, dtype=np.uint8).reshape(h, w, 3)
            k = window_of(index, max(total, index + 1), num_frames)
            if k != window:
                flush()
                best, window = None, k
            score = sharpness(pixels)
            if best is None or score > best[0]:
                best = (score, index, pixels.copy())
            if on_progress is not None:
                on_progress(index + 1, max(total, index + 1))
    except (OSError, RuntimeError) as err:
        raise _unreadable(path, err) from err
    finally:
        gen.close()
    flush()
    if not kept:
        raise _unreadable(path, "no frame could be decoded")
    if on_progress is not None:
        on_progress(index + 1, index + 1)
    return kept, info


def _count_frames(path: Path) -> int:
    """Frames of a clip whose container gives no duration (decodes it once)."""
    import imageio_ffmpeg

    try:
        return int(imageio_ffmpeg.count_frames_and_secs(str(path))[0])
    except (OSError, RuntimeError, ValueError) as err:
        raise _unreadable(path, err) from err
