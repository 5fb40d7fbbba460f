"""Frames from a video: the sharpest of each window of the clip, written as JPEGs; bad files say so."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from walk import box_blur, encode_clip

from nerf_lightning.capture.video_frames import extract_frames, probe_video, window_of
from nerf_lightning.errors import UserError


def test_windows_split_the_clip_evenly() -> None:
    assert [window_of(i, 10, 5) for i in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [window_of(i, 7, 3) for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    assert [window_of(i, 4, 10) for i in range(4)] == [0, 1, 2, 3]  # short clip: every frame
    assert window_of(12, 10, 5) == 4  # frames past the estimated count join the last window


def _texture(seed: int, size: int = 48) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (size // 4, size // 4, 3), dtype=np.uint8)
    return np.repeat(np.repeat(small, 4, axis=0), 4, axis=1)  # 4-pixel blocks: survives H.264


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """18 frames: in each group of three, one sharp and two blurred copies, the sharp one moving."""
    frames = []
    for k in range(6):
        sharp = _texture(k)
        group = [box_blur(sharp, 2), box_blur(sharp, 2), box_blur(sharp, 2)]
        group[k % 3] = sharp
        frames += group
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    encode_clip(frames, path, fps=6)
    return path


def test_the_sharpest_frame_of_each_window_is_kept(clip: Path, tmp_path: Path) -> None:
    seen = []
    frames, info = extract_frames(clip, tmp_path / "images", 6, on_progress=lambda d, t: seen.append((d, t)))
    assert info.n_frames == 18 and info.size == (48, 48) and info.fps == pytest.approx(6.0)
    assert [f.index for f in frames] == [3 * k + k % 3 for k in range(6)]
    assert [f.name for f in frames] == [f"frame_{i:05d}.jpg" for i in range(1, 7)]
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == [f.name for f in frames]
    assert frames[2].time == pytest.approx(frames[2].index / 6.0)
    assert iio.imread(tmp_path / "images" / frames[0].name).shape == (48, 48, 3)
    assert seen[-1] == (18, 18) and seen[0] == (1, 18)


def test_downscale_shrinks_the_frames(clip: Path, tmp_path: Path) -> None:
    frames, info = extract_frames(clip, tmp_path / "images", 3, downscale=2)
    assert info.size == (24, 24) and len(frames) == 3
    assert iio.imread(tmp_path / "images" / frames[0].name).shape == (24, 24, 3)


def test_a_file_that_is_no_video_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "clip.mp4"
    bad.write_bytes(b"this is not a video" * 100)
    with pytest.raises(UserError, match=r"video=.*clip\.mp4: cannot read it as a video"):
        extract_frames(bad, tmp_path / "images", 10)
    with pytest.raises(UserError, match=r"video=.*missing\.mp4: no such file"):
        probe_video(tmp_path / "missing.mp4")
    assert not (tmp_path / "images").exists() or not any((tmp_path / "images").iterdir())
