"""Known damage to a capture's training views, for tests that a run's corrections recover it.

Photographs come with slightly wrong poses and changing exposures; the learned corrections
(``model.net.camera_opt``, ``model.net.appearance``) are meant to undo both. This writes a copy of an
instant-ngp capture (the embedded synthetic scene, lego, ...) whose *training* views are damaged by a
seeded, exactly known amount, and ``damage.json`` with the truth; held-out views are left as they were
(their poses are the truth, their colours the reference), so that a held-out metric measures the field.

- poses (:func:`damage_poses`): each training camera turned about its centre by a random axis and an
  angle drawn uniformly in ``rotation_deg`` (1-2 degrees), and its centre moved in a random direction by
  ``translation_frac`` (1-2 %) of its distance to the capture frame's origin (the scene centre of the
  synthetic scene and of the Blender renders);
- colours (:func:`damage_gains`): each training image's RGB multiplied by a per-channel gain drawn
  uniformly in ``gain`` (0.7-1.3); every image (held-out ones too) is first scaled by ``headroom`` so
  that gains above 1 need not clip (the fraction of clipped values is recorded).

``damage.json``: ``{"kind", "seed", "frames": [{"file_path", "rotation" (axis-angle, radians, world
frame), "translation" (world units), "gain" [3]}]}`` for the training frames, in the file's order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.formats import load_capture

__all__ = ["damage_gains", "damage_poses", "rotation_matrix"]


def rotation_matrix(w: np.ndarray) -> np.ndarray:
    """The rotation of axis-angle ``w`` [3] (Rodrigues)."""
    t = float(np.linalg.norm(w))
    if t < 1e-12:
        return np.eye(3)
    k = np.array([[0, -w[2], w[1]], [w[2], 0, -w[0]], [-w[1], w[0], 0]]) / t
    return np.eye(3) + math.sin(t) * k + (1 - math.cos(t)) * k @ k


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=3)
    return v / np.linalg.norm(v)


def _load(src: Path, test_every: int) -> tuple[dict[str, Any], list[int]]:
    """The capture's transforms.json (image paths made absolute) and the indices of its training frames."""
    doc = json.loads((src / "transforms.json").read_text())
    train = {p.image_path.resolve() for p in (f for f in load_capture(src, test_every=test_every).train)}
    indices = []
    for i, frame in enumerate(doc["frames"]):
        path = (src / frame["file_path"]).resolve()
        if not path.suffix and not path.exists():
            path = path.with_suffix(".png")  # Blender captures name frames without their extension
        frame["file_path"] = str(path)
        if path in train:
            indices.append(i)
    if not indices:
        raise ValueError(f"{src}: no training frame found to damage")
    return doc, indices


def damage_poses(
    src: Path,
    out: Path,
    seed: int = 0,
    rotation_deg: tuple[float, float] = (1.0, 2.0),
    translation_frac: tuple[float, float] = (0.01, 0.02),
    test_every: int = 8,
) -> Path:
    """``out/transforms.json``: the capture at ``src`` with its training poses damaged (the images stay
    where they are); returns ``out``. ``test_every``: the data's held-out split (``data.test_every``)."""
    doc, train = _load(src, test_every)
    rng = np.random.default_rng(seed)
    truth = []
    for i in train:
        frame = doc["frames"][i]
        m = np.array(frame["transform_matrix"], dtype=np.float64)
        w = _unit(rng) * math.radians(rng.uniform(*rotation_deg))
        t = _unit(rng) * rng.uniform(*translation_frac) * float(np.linalg.norm(m[:3, 3]))
        m[:3, :3] = rotation_matrix(w) @ m[:3, :3]
        m[:3, 3] += t
        frame["transform_matrix"] = m.tolist()
        truth.append({"file_path": frame["file_path"], "rotation": w.tolist(), "translation": t.tolist()})
    _write(out, doc, {"kind": "poses", "seed": seed, "frames": truth})
    return out


def damage_gains(
    src: Path,
    out: Path,
    seed: int = 0,
    gain: tuple[float, float] = (0.7, 1.3),
    headroom: float = 1.0,
    test_every: int = 8,
) -> Path:
    """``out/transforms.json`` and ``out/images/``: the capture at ``src`` with each training image's
    RGB multiplied by a known per-channel gain (all images first by ``headroom``); returns ``out``."""
    import imageio.v3 as iio

    doc, train = _load(src, test_every)
    rng = np.random.default_rng(seed)
    gains = {i: rng.uniform(*gain, size=3) for i in train}
    (out / "images").mkdir(parents=True, exist_ok=True)
    clipped = total = 0
    for i, frame in enumerate(doc["frames"]):
        image = iio.imread(frame["file_path"])
        scale = 255.0 if image.dtype == np.uint8 else 65535.0
        x = image.astype(np.float64) / scale
        rgb = x[..., :3] * headroom * gains.get(i, np.ones(3))
        clipped += int((rgb > 1.0).sum())
        total += rgb.size
        x[..., :3] = np.clip(rgb, 0.0, 1.0)
        name = f"images/{i:04d}.png"
        iio.imwrite(out / name, np.round(x * scale).astype(image.dtype))
        frame["file_path"] = name
    truth = [{"file_path": doc["frames"][i]["file_path"], "gain": gains[i].tolist()} for i in train]
    record = {"kind": "gains", "seed": seed, "headroom": headroom, "clipped_fraction": clipped / total}
    _write(out, doc, {**record, "frames": truth})
    return out


def _write(out: Path, doc: dict[str, Any], truth: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "transforms.json").write_text(json.dumps(doc, indent=1))
    (out / "damage.json").write_text(json.dumps(truth, indent=1))
