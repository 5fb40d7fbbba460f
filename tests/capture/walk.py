"""A synthetic walk around the embedded scene, the input of the ``process`` tests, and pose errors.

The objects and ground disc of :class:`~nerf_lightning.data.synthetic.SyntheticScene`, seen by
:data:`N_VIEWS` cameras on one loop around them (azimuth in steps of 360 / N_VIEWS degrees, the
elevation swinging 18-42 degrees three times per loop, all looking at the scene's centre), rendered
at :data:`SIZE` x :data:`SIZE` with a 50 degree pinhole lens as opaque RGB photographs, inside a
room: a sphere of radius :data:`ROOM_RADIUS` around them, textured with multi-octave noise.

Why the room: with the objects alone (over a transparent or plain background) the 3D points span a
small depth range, and a small turn of a camera looks like a small shift of it; the poses then came
out 0.5 degrees and 1.3 % of the radius off on average (a structure-from-motion solution with the
same reprojection error as the true cameras'). The phone rig's tiled floor repeats every half
unit and let the matcher pair distant tiles, which flipped part of the loop. Distant, non-repeating
texture fixes both (``docs/process.md``). Consecutive views are the frames of the video tests (an
orbit filmed by a phone).

The oracle of the tests is here too: recovered poses against the true ones up to a similarity
(Umeyama's least-squares fit of the camera centres), written without the library's code.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from nerf_lightning.data.synthetic import SyntheticScene, look_at, render_view
from nerf_lightning.data.synthetic.noise import fbm

N_VIEWS = 40
SIZE = 192
ROOM_RADIUS = 4.5
FOV_X_DEG = 50.0
DISTANCE = 2.8
LOOK_AT = np.array([0.0, 0.0, 0.25])
FOCAL = 0.5 * SIZE / math.tan(math.radians(FOV_X_DEG) / 2)


class RoomScene(SyntheticScene):
    """The embedded scene inside a sphere of radius :data:`ROOM_RADIUS` (centre :data:`LOOK_AT`)
    textured with noise (features down to ~0.06 units, a few pixels at these distances)."""

    def trace(self, origins: np.ndarray, dirs: np.ndarray):
        rgb, alpha, t, point = super().trace(origins, dirs)
        miss = alpha < 0.5
        if miss.any():
            o = origins[miss] - LOOK_AT
            d = dirs[miss] / np.linalg.norm(dirs[miss], axis=1, keepdims=True)
            b = (o * d).sum(axis=1)
            dist = -b + np.sqrt(b * b - ((o * o).sum(axis=1) - ROOM_RADIUS**2))  # from inside the sphere
            q = (o + dist[:, None] * d) * 4.0
            u, v = fbm(q, octaves=3, seed=11), fbm(q, octaves=3, seed=12)
            rgb[miss] = np.stack([0.2 + 0.7 * u, 0.25 + 0.5 * v, 0.3 + 0.6 * (1.0 - u)], axis=1)
            alpha[miss] = 1.0
            t[miss] = dist
        return rgb, alpha, t, point


def walk_poses(n: int = N_VIEWS, distance: float = DISTANCE) -> np.ndarray:
    """[n, 4, 4] NeRF/OpenGL camera-to-world of the loop, in capture order."""
    k = np.arange(n)
    azimuth = 2.0 * math.pi * k / n
    elevation = np.radians(30.0 + 12.0 * np.sin(2.0 * math.pi * 3.0 * k / n))
    dirs = np.stack(
        [np.cos(elevation) * np.cos(azimuth), np.cos(elevation) * np.sin(azimuth), np.sin(elevation)], axis=1
    )
    return np.stack([look_at(LOOK_AT + distance * d, LOOK_AT) for d in dirs])


def render_walk(out_dir: Path, n: int = N_VIEWS, size: int = SIZE) -> np.ndarray:
    """Render the loop into ``out_dir/0000.png ...`` (8-bit RGB); returns its poses [n, 4, 4]."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scene = RoomScene()
    poses = walk_poses(n)
    f = 0.5 * size / math.tan(math.radians(FOV_X_DEG) / 2)

    def one(i: int) -> None:
        rgba = render_view(
            scene, poses[i], (f, f, size / 2, size / 2), size, size, supersample=2,
            rng=np.random.default_rng([7, i]),
        )  # fmt: skip
        iio.imwrite(out_dir / f"{i:04d}.png", np.round(rgba[..., :3] * 255.0).astype(np.uint8))

    with ThreadPoolExecutor(2) as pool:  # numpy releases the GIL in its array loops
        list(pool.map(one, range(n)))
    return poses


def box_blur(img: np.ndarray, radius: int = 2) -> np.ndarray:
    """[H, W, 3] uint8 -> the mean over a (2 radius + 1)^2 window (edges clamped): a smeared frame."""
    x = np.pad(img.astype(np.float64), ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    k = 2 * radius + 1
    c = np.cumsum(np.cumsum(x, axis=0), axis=1)
    c = np.pad(c, ((1, 0), (1, 0), (0, 0)))
    h, w = img.shape[:2]
    s = c[k : k + h, k : k + w] - c[:h, k : k + w] - c[k : k + h, :w] + c[:h, :w]
    return np.round(s / (k * k)).astype(np.uint8)


def encode_clip(frames: list[np.ndarray], path: Path, fps: int = 10) -> None:
    """H.264 MP4 of [H, W, 3] uint8 frames (imageio-ffmpeg, near-lossless quality)."""
    import imageio_ffmpeg

    h, w = frames[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(
        str(path), (w, h), fps=fps, codec="libx264", quality=10, macro_block_size=16, pix_fmt_out="yuv420p"
    )
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()


def write_true_capture(out: Path, recovered: Path, true_c2w: dict[str, np.ndarray]) -> Path:
    """The recovered capture with the true poses and intrinsics, in the recovered capture's frame.

    ``true_c2w`` maps each frame's ``file_path`` to its true pose already aligned to the recovered
    frame (see :func:`align`): both trainings then see the same images, box and scale, and differ in
    the poses and intrinsics only. The images are linked.
    """
    doc = json.loads((recovered / "transforms.json").read_text())
    doc.update(fl_x=FOCAL, fl_y=FOCAL, cx=SIZE / 2, cy=SIZE / 2, k1=0.0, k2=0.0, p1=0.0, p2=0.0)
    for frame in doc["frames"]:
        frame["transform_matrix"] = true_c2w[frame["file_path"]].tolist()
    out.mkdir(parents=True)
    (out / "images").symlink_to((recovered / "images").resolve())
    (out / "transforms.json").write_text(json.dumps(doc, indent=2))
    return out


def umeyama(src: np.ndarray, dst: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R, t) minimizing sum |s R src_i + t - dst_i|^2 over points [N, 3] (Umeyama 1991)."""
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    xs, xd = src - mu_s, dst - mu_d
    u, sig, vt = np.linalg.svd(xd.T @ xs / len(src))
    d = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        d[2, 2] = -1.0
    rot = u @ d @ vt
    s = float(np.trace(np.diag(sig) @ d) / (xs**2).sum(axis=1).mean())
    return s, rot, mu_d - s * rot @ mu_s


def align(recovered: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Recovered [V, 4, 4] NeRF poses against the true ones up to a similarity.

    Returns (the true poses mapped into the recovered frame [V, 4, 4], errors): ``rotation_max_deg``
    / ``rotation_mean_deg`` (angle of R_true^T R_aligned), ``centre_max`` / ``centre_mean``
    (distance of the aligned centre from the true one over the scene radius, the true cameras' mean
    distance from the scene centre).
    """
    s, rot, t = umeyama(recovered[:, :3, 3], true[:, :3, 3])
    centres = s * recovered[:, :3, 3] @ rot.T + t
    radius = float(np.linalg.norm(true[:, :3, 3] - LOOK_AT, axis=1).mean())
    centre_err = np.linalg.norm(centres - true[:, :3, 3], axis=1) / radius
    rel = np.einsum("vji,jk,vkl->vil", true[:, :3, :3], rot, recovered[:, :3, :3])
    angle = np.degrees(np.arccos(np.clip((np.trace(rel, axis1=1, axis2=2) - 1.0) / 2.0, -1.0, 1.0)))
    inverse = np.zeros_like(true)
    inverse[:, :3, :3] = np.einsum("ji,vjk->vik", rot, true[:, :3, :3])
    inverse[:, :3, 3] = (true[:, :3, 3] - t) @ rot / s
    inverse[:, 3, 3] = 1.0
    errors = {
        "rotation_max_deg": float(angle.max()),
        "rotation_mean_deg": float(angle.mean()),
        "centre_max": float(centre_err.max()),
        "centre_mean": float(centre_err.mean()),
    }
    return inverse, errors
