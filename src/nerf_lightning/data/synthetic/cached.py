"""The embedded scenes, rendered once and reused: the default scene of ``make train``, and big
captures of it for tests and benchmarks of ``data.shard`` / ``data.storage``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nerf_lightning.data.synthetic import generate
from nerf_lightning.data.synthetic.generate import GENERATOR_VERSION, generate_scene

__all__ = ["ensure_default_scene", "ensure_large_capture"]


def ensure_default_scene(root: Path = Path("outputs/scenes")) -> Path:
    """Generate (first call) or reuse the embedded default scene; returns its directory
    ``root / f"default-v{GENERATOR_VERSION}"`` (holding transforms.json and images/)."""
    out = Path(root) / f"default-v{GENERATOR_VERSION}"
    generate_scene(out, **generate.DEFAULT_SCENE, verbose=True)
    return out


def ensure_large_capture(
    root: Path,
    n_views: int,
    width: int,
    height: int,
    supersample: int = 1,
    workers: int | None = None,
    repeat: int = 1,
) -> Path:
    """A capture of the embedded scene of ``n_views`` orbit views at ``width`` x ``height``, for tests
    and benchmarks of captures bigger than a device (``data.shard``, ``data.storage``): rendered once
    into ``root / f"large-{n_views}x{width}x{height}-v{GENERATOR_VERSION}"`` and reused while its
    parameters match (:func:`generate_scene`'s cache). Its training pixels take about
    ``n_views * repeat * width * height * 4`` bytes (RGBA uint8) on the device.

    ``repeat`` > 1: a capture of ``n_views * repeat`` frames at the cost of ``n_views`` renders (tens of
    GB without rendering tens of GB), in a folder of its own (``...-x{repeat}``) whose transforms.json
    lists the rendered views ``repeat`` times over, round after round (the same images and poses).
    With ``n_views`` a multiple of 8 the frames that ``data.test_every=8`` holds out are every copy of
    views 0, 8, 16, ...: no held-out view is also a training view."""
    out = Path(root) / f"large-{n_views}x{width}x{height}-v{GENERATOR_VERSION}"
    generate_scene(out, n_views=n_views, width=width, height=height, supersample=supersample, workers=workers)
    if repeat <= 1:
        return out
    many = out.with_name(f"{out.name}-x{int(repeat)}")
    doc = json.loads((out / "transforms.json").read_text())
    frames = [{**f, "file_path": f"../{out.name}/{f['file_path']}"} for f in doc["frames"]]
    doc["frames"] = frames * int(repeat)  # round after round: frame i is view i % n_views
    text = json.dumps(doc, indent=1)
    target = many / "transforms.json"
    if target.is_file() and target.read_text() == text:
        return many
    many.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)  # atomic: a reader sees the old list or the whole new one
    return many
