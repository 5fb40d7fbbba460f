"""Render the procedural scene from many cameras into an instant-ngp (fox-style) capture, cached on disk.

Output layout (``OUT_DIR``)::

    transforms.json        camera_angle_x/y, fl_x, fl_y, cx, cy, w, h, k1 k2 p1 p2, aabb_scale, scale,
                           offset, generator (parameters + version, the cache key), frames[...]
    images/0000.png ...    8-bit RGBA; alpha 0 = background (train on random backgrounds, evaluate
                           over white), anti-aliased edges from jittered supersampling

Frames are NeRF/Blender camera-to-world matrices (OpenGL camera axes) in world coordinates; the
loader turns them into NGP space with ``scale`` and ``offset``. Orbit views come first (a low-discrepancy
spiral over elevations 15-60 degrees, so every 8th view held out is spread over the whole orbit);
optional close-up ("hard") views follow them.

Rigs (``rig=``):

``orbit`` (default)
    Square pixels, centred principal point, optional mild lens (:data:`DISTORTION`), RGBA images of the
    objects over a transparent background, ``aabb_scale`` 1.
``phone``
    The camera model and layout of a handheld phone capture run through COLMAP + ``colmap2nerf`` (the
    shared ``fruit`` capture): portrait images, ``fl_x != fl_y``, a principal point off the image
    centre, radial + tangential distortion (:data:`PHONE_LENS`, the fruit capture's coefficients),
    cameras all around at 24-72 degrees elevation looking down at the objects, opaque RGB images of the
    objects on a floor that reaches the horizon under a sky (no alpha: nothing says where empty space
    is), and ``aabb_scale`` 32 with the cameras inside the box.

Scenes (``scene=``):

``default``
    The procedural objects of :class:`~nerf_lightning.data.synthetic.scene.SyntheticScene`.
``fruit_bed``
    :class:`~nerf_lightning.data.synthetic.scene.FruitBedScene`: an apple and a banana on a near-white
    bed that fills the view, like the shared ``fruit`` capture. With the ``phone`` rig it reproduces
    the fruit capture's failure (``docs/investigations/2026-11-30-fruit-failure.md``): without a near
    plane the default hash grid memorizes the training views instead of forming geometry
    (:data:`FRUIT_FAILURE` is the capture of the CPU test ``tests/data/test_fruit_failure.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from nerf_lightning.data.synthetic.camera import camera_rays, look_at
from nerf_lightning.data.synthetic.scene import FruitBedScene, SyntheticScene

__all__ = [
    "PHONE_LENS",
    "RIGS",
    "SCENES",
    "FRUIT_FAILURE",
    "phone_poses",
    "GENERATOR_NAME",
    "GENERATOR_VERSION",
    "DEFAULT_SCENE",
    "DISTORTION",
    "generate_scene",
    "orbit_poses",
    "closeup_poses",
    "render_view",
    "main",
]

GENERATOR_NAME = "nerf_lightning.synthetic"
#: bump whenever the scene, cameras or shading change: cached scenes of another version are regenerated
GENERATOR_VERSION = 1
#: horizontal field of view of every camera (degrees)
FOV_X_DEG = 50.0
#: OpenCV k1, k2, p1, p2 of the ``distortion=True`` camera (mild barrel + a little tangential)
DISTORTION = (-0.2, 0.05, 0.002, -0.0015)
#: NGP transform: world * SCALE + OFFSET puts the whole scene (radius 1.2, height 0.8) inside [0, 1]^3
SCALE = 0.33
OFFSET = (0.5, 0.5, 0.5)
AABB_SCALE = 1
#: parameters of the embedded default scene of ``make train`` (see :func:`ensure_default_scene`)
DEFAULT_SCENE = {"n_views": 64, "width": 256, "height": 256, "seed": 0, "distortion": False, "supersample": 2}
RIGS = ("orbit", "phone")
#: the phone rig's intrinsics relative to the image size and its OpenCV lens, from the fruit capture
#: (605x806: fl_x 627.8, fl_y 616.5, cx 318.8, cy 395.3, k1 -0.0024, k2 -0.0213, p1 0.0110, p2 0.0096)
PHONE_FX_PER_WIDTH, PHONE_FY_PER_WIDTH = 627.79 / 605.0, 616.50 / 605.0
PHONE_CX_PER_WIDTH, PHONE_CY_PER_HEIGHT = 318.79 / 605.0, 395.33 / 806.0
PHONE_LENS = (-0.002425, -0.021258, 0.011019, 0.009578)
PHONE_AABB_SCALE = 32
#: the floor of the phone rig reaches far beyond the box (the horizon is seen by the low cameras)
PHONE_FLOOR_RADIUS = 400.0

#: ``scene=`` name -> the world it renders
_SCENE_TYPES: dict[str, type[SyntheticScene]] = {"default": SyntheticScene, "fruit_bed": FruitBedScene}
SCENES = tuple(_SCENE_TYPES)
#: the fruit capture's failure class, generated: the phone rig over the fruit-bed scene, 40 views at
#: the fruit capture's 1/16 resolution (37x50), 5 of them held out. On a CPU (``bench.capture_ab``'s
#: ``CPU_REPRO`` without the downscale) and without a near plane the default hash grid fails on the
#: held-out views; the default near plane (0.2) reconstructs them
#: (``docs/investigations/2026-11-30-fruit-failure.md``)
FRUIT_FAILURE = {"rig": "phone", "scene": "fruit_bed", "n_views": 40, "width": 37, "height": 50, "seed": 0}

_LOOK_AT = np.array([0.0, 0.0, 0.25])


def _view_directions(n_views: int, rng: np.random.Generator, elev_lo: float, elev_hi: float) -> np.ndarray:
    """Unit directions [n_views, 3] from the scene towards the cameras: low-discrepancy azimuths with a
    little jitter, elevations rising from ``elev_lo`` to ``elev_hi`` degrees (uniform in sin)."""
    k = np.arange(n_views)
    # silver-ratio steps (149 deg): unlike the golden angle (8 steps ~ 20 deg, 8 is a Fibonacci
    # number) every 8th view -- the held-out ones -- still steps 113 deg around the orbit
    azimuth = 2 * math.pi * ((k * (math.sqrt(2.0) - 1.0)) % 1.0) + rng.uniform(-0.15, 0.15, n_views)
    s_lo, s_hi = math.sin(math.radians(elev_lo)), math.sin(math.radians(elev_hi))
    elevation = np.arcsin(s_lo + (s_hi - s_lo) * (k + rng.uniform(0.2, 0.8, n_views)) / n_views)
    return np.stack(
        [np.cos(elevation) * np.cos(azimuth), np.cos(elevation) * np.sin(azimuth), np.sin(elevation)], axis=1
    )


def orbit_poses(n_views: int, seed: int = 0) -> np.ndarray:
    """Cameras around the scene: float64 [n_views, 4, 4] camera-to-world (OpenGL axes), world coordinates.

    Low-discrepancy azimuths with elevations rising from 15 to 60 degrees (uniform in sin(elevation)),
    distance 3.15-3.65 and a small seeded jitter of azimuth, distance and look-at point.
    """
    rng = np.random.default_rng([seed, 1])
    dirs = _view_directions(n_views, rng, 15.0, 60.0)
    distance = rng.uniform(3.15, 3.65, n_views)
    targets = _LOOK_AT + rng.uniform(-0.05, 0.05, (n_views, 3))
    return np.stack([look_at(t + r * d, t) for t, r, d in zip(targets, distance, dirs, strict=True)])


def phone_poses(n_views: int, seed: int = 0) -> np.ndarray:
    """A handheld walk around the objects: float64 [n_views, 4, 4] camera-to-world (OpenGL axes).

    Low-discrepancy azimuths, elevations 24-72 degrees (uniform in sin(elevation)) at distance 3.2-4.8
    (the fruit capture's cameras sit 1.0-1.75 NGP units = 3-5.3 world units from the point their
    optical axes converge to), aimed at jittered points around the objects' centre, with a few
    degrees of roll as a hand holds a phone.
    """
    rng = np.random.default_rng([seed, 4])
    dirs = _view_directions(n_views, rng, 24.0, 72.0)
    distance = rng.uniform(3.2, 4.8, n_views)
    targets = _LOOK_AT + rng.uniform(-0.12, 0.12, (n_views, 3))
    poses = []
    for t, r, d, roll in zip(targets, distance, dirs, rng.uniform(-0.08, 0.08, n_views), strict=True):
        c2w = look_at(t + r * d, t)
        c, s_ = math.cos(roll), math.sin(roll)
        c2w[:3, :2] = c2w[:3, :2] @ np.array([[c, s_], [-s_, c]])  # roll about the viewing axis
        poses.append(c2w)
    return np.stack(poses)


def closeup_poses(n_views: int, scene: SyntheticScene, seed: int = 0) -> np.ndarray:
    """Close-ups (distance 0.75-1.1) of the most detailed region: the checkered box's outward faces and
    top (0.08 checkers, frame lines, noise) with the ground around it. float64 [n_views, 4, 4].

    Cameras that would fall inside an object or below z = 0.1 are redrawn (a loop over cameras only).
    """
    rng = np.random.default_rng([seed, 2])
    box = scene.objects[1]
    rot, c = box.rotation, np.asarray(box.center)
    # (target in box-local coordinates, outward direction in box-local coordinates)
    spots = [
        (np.array([-box.half[0], 0.0, 0.0]), np.array([-1.0, 0.0, 0.0])),
        (np.array([0.0, -box.half[1], 0.0]), np.array([0.0, -1.0, 0.0])),
        (np.array([0.0, 0.0, box.half[2]]), np.array([-0.5, -0.5, 0.7])),
        (np.array([-box.half[0], -box.half[1], -box.half[2]]), np.array([-1.0, -1.0, 0.0])),
    ]
    poses = []
    while len(poses) < n_views:
        local_target, local_dir = spots[len(poses) % len(spots)]
        target = c + rot @ local_target
        out = rot @ local_dir
        az = math.atan2(out[1], out[0]) + rng.uniform(-0.45, 0.45)
        el = math.radians(rng.uniform(20.0, 50.0))
        eye = target + rng.uniform(0.75, 1.1) * np.array(
            [math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)]
        )
        inside = any(
            np.isfinite(o.intersect(eye[None], np.array([[0.0, 0.0, 1.0]])))[0]
            and np.isfinite(o.intersect(eye[None], np.array([[0.0, 0.0, -1.0]])))[0]
            for o in scene.objects[1:]
        )
        if eye[2] > 0.1 and not inside:
            poses.append(look_at(eye, target))
    return np.stack(poses) if poses else np.zeros((0, 4, 4))


def render_view(
    scene: SyntheticScene,
    c2w: np.ndarray,
    intrinsics: tuple[float, float, float, float],
    width: int,
    height: int,
    distortion: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    supersample: int = 2,
    rng: np.random.Generator | None = None,
    sky: bool = False,
) -> np.ndarray:
    """Render one view: float64 [height, width, 4] straight (not premultiplied) RGBA in [0, 1].

    Each pixel averages ``supersample**2`` rays at stratified jittered positions inside it (only the
    pixel centre when ``supersample == 1``); rgb is the mean colour of the samples that hit, alpha the
    fraction that hit, so compositing over any background reproduces the box-filtered image. With
    ``sky`` the rays that hit nothing see ``scene.sky`` instead: rgb is the mean over all samples and
    alpha is 1 (an opaque photograph).
    """
    fx, fy, cx, cy = intrinsics
    s = int(supersample)
    if s < 1:
        raise ValueError(f"supersample must be >= 1, got {supersample}")
    rng = rng if rng is not None else np.random.default_rng(0)
    v, u = np.meshgrid(np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64), indexing="ij")
    if s == 1:
        sub = np.full((1, 2), 0.5)
        jitter = np.zeros((height, width, 1, 2))
    else:
        a, b = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
        sub = np.stack([a.ravel(), b.ravel()], axis=1) / s  # stratum corners [s*s, 2]
        jitter = rng.uniform(0.0, 1.0 / s, (height, width, s * s, 2))
    px = np.stack([u, v], axis=-1)[:, :, None, :] + sub + jitter  # [h, w, s*s, 2]
    origins, dirs = camera_rays(c2w, fx, fy, cx, cy, width, height, *distortion, pixels=px.reshape(-1, 2))
    rgb, alpha, _, _ = scene.trace(origins, dirs)
    if sky:
        rgb = np.where(alpha[:, None] > 0, rgb, scene.sky(dirs))
        alpha = np.ones_like(alpha)
    rgb = rgb.reshape(height, width, s * s, 3)
    alpha = alpha.reshape(height, width, s * s)
    cover = alpha.sum(axis=-1)
    out = np.zeros((height, width, 4))
    out[..., :3] = (rgb * alpha[..., None]).sum(axis=2) / np.maximum(cover, 1.0)[..., None]
    out[..., 3] = cover / (s * s)
    return out


def _default_workers() -> int:
    """Cores this process may use (affinity-aware), at most 4: each thread holds ~200 MB of rays."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def _generator_meta(
    n_views: int,
    width: int,
    height: int,
    seed: int,
    distortion: bool,
    supersample: int,
    hard_views: int,
    rig: str = "orbit",
    scene: str = "default",
) -> dict:
    extra = {} if rig == "orbit" else {"rig": rig}  # default-rig keys unchanged: cached scenes stay valid
    if scene != "default":  # the same value as the informative "scene" of every generator block
        extra["scene"] = _scene_tag(scene)
    return {
        **extra,
        "name": GENERATOR_NAME,
        "version": GENERATOR_VERSION,
        "seed": int(seed),
        "n_views": int(n_views),
        "hard_views": int(hard_views),
        "width": int(width),
        "height": int(height),
        "supersample": int(supersample),
        "distortion": bool(distortion),
        "fov_x_deg": FOV_X_DEG,
    }


def _scene_tag(scene: str) -> str:
    """The generator block's ``scene`` entry: ``default-v1``, ``fruit-bed-v1``."""
    return f"{scene.replace('_', '-')}-v1"


def _read_meta(transforms: Path) -> dict | None:
    try:
        with open(transforms) as f:
            return json.load(f).get("generator")
    except (OSError, ValueError):
        return None


def generate_scene(
    out_dir: Path,
    n_views: int = 64,
    width: int = 256,
    height: int = 256,
    seed: int = 0,
    distortion: bool = False,
    supersample: int = 2,
    hard_views: int = 0,
    overwrite: bool = False,
    verbose: bool = False,
    workers: int | None = None,
    rig: str = "orbit",
    scene: str = "default",
) -> Path:
    """Render the synthetic scene into ``out_dir`` (cached) and return the path of its transforms.json.

    The scene is written into a temporary sibling directory and renamed into place at the end, so an
    interrupted run never leaves a half-written scene. If ``out_dir`` already holds a complete scene
    whose ``generator`` metadata equals these parameters (and the generator version), it is returned
    untouched unless ``overwrite``; any other content of ``out_dir`` is replaced.

    Args:
        out_dir: destination directory (created with its parents).
        n_views: orbit views (every 8th is the loader's default validation view).
        width, height: image size in pixels; the horizontal field of view is 50 degrees, square pixels.
        seed: camera jitter and supersampling jitter (the scene itself is fixed).
        distortion: render through an OpenCV k1 k2 p1 p2 lens (:data:`DISTORTION`).
        supersample: jittered samples per pixel per axis (anti-aliasing).
        hard_views: extra close-up views of the checkered box appended after the orbit views.
        overwrite: regenerate even if a matching scene exists.
        verbose: print progress to stderr.
        workers: rendering threads (default: the usable cores, at most 4); images do not depend on it.
        rig: ``orbit`` or ``phone`` (see the module docstring); ``phone`` ignores ``distortion`` (it
            always has its lens) and ``hard_views``, and writes opaque RGB images.
        scene: ``default`` or ``fruit_bed`` (see the module docstring).
    """
    if n_views < 1 or width < 8 or height < 8 or hard_views < 0:
        raise ValueError(
            f"generate_scene: need n_views >= 1, width/height >= 8, hard_views >= 0; got n_views={n_views}, "
            f"width={width}, height={height}, hard_views={hard_views}"
        )
    if rig not in RIGS:
        raise ValueError(f"generate_scene: rig must be one of {RIGS}, got {rig!r}")
    if scene not in SCENES:
        raise ValueError(f"generate_scene: scene must be one of {SCENES}, got {scene!r}")
    if scene != "default" and hard_views:
        raise ValueError("generate_scene: hard_views (close-ups of the checkered box) need scene='default'")
    phone = rig == "phone"
    if phone:
        distortion, hard_views = True, 0
    out_dir = Path(out_dir)
    meta = _generator_meta(n_views, width, height, seed, distortion, supersample, hard_views, rig, scene)
    transforms = out_dir / "transforms.json"
    stored = _read_meta(transforms)
    # the stored block also has informative keys (timing, bounds): the cache key is `meta` only
    if not overwrite and isinstance(stored, dict) and {k: stored.get(k) for k in meta} == meta:
        return transforms

    t_start = time.perf_counter()
    if phone:
        world = _SCENE_TYPES[scene](floor_radius=PHONE_FLOOR_RADIUS)
        fx, fy = PHONE_FX_PER_WIDTH * width, PHONE_FY_PER_WIDTH * width
        cx, cy = PHONE_CX_PER_WIDTH * width, PHONE_CY_PER_HEIGHT * height
        k = PHONE_LENS
        poses = phone_poses(n_views, seed)
        kinds = ["phone"] * n_views
    else:
        world = _SCENE_TYPES[scene]()
        fx = fy = 0.5 * width / math.tan(math.radians(FOV_X_DEG) / 2)
        cx, cy = width / 2.0, height / 2.0
        k = DISTORTION if distortion else (0.0, 0.0, 0.0, 0.0)
        poses = np.concatenate([orbit_poses(n_views, seed), closeup_poses(hard_views, world, seed)])
        kinds = ["orbit"] * n_views + ["closeup"] * hard_views

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "images").mkdir()

        def render_one(i: int) -> None:
            # per-view generator: images do not depend on the thread schedule or on hard_views
            rng = np.random.default_rng([seed, 3, i])
            intr = (fx, fy, cx, cy)
            rgba = render_view(world, poses[i], intr, width, height, k, supersample, rng, sky=phone)
            pixels = rgba[..., :3] if phone else rgba  # a photograph has no alpha channel
            iio.imwrite(tmp / f"images/{i:04d}.png", np.round(pixels * 255.0).astype(np.uint8))

        # numpy releases the GIL inside its large array loops, so threads use several cores without
        # the start-up cost and fork hazards of processes (this may run inside a torch program)
        pool = ThreadPoolExecutor(max(1, min(workers or _default_workers(), len(poses))))
        try:
            for done, _ in enumerate(pool.map(render_one, range(len(poses))), start=1):
                if verbose:
                    print(f"\r[synthetic] view {done}/{len(poses)}", end="", file=sys.stderr, flush=True)
        finally:
            # on an error or Ctrl-C do not render the queued views before giving up
            pool.shutdown(wait=True, cancel_futures=True)
        frames = [
            {"file_path": f"images/{i:04d}.png", "transform_matrix": c2w.tolist(), "kind": kind}
            for i, (c2w, kind) in enumerate(zip(poses, kinds, strict=True))
        ]
        doc = {
            "camera_angle_x": 2 * math.atan(width / (2 * fx)),
            "camera_angle_y": 2 * math.atan(height / (2 * fy)),
            "fl_x": fx,
            "fl_y": fy,
            "cx": cx,
            "cy": cy,
            "w": width,
            "h": height,
            "k1": k[0],
            "k2": k[1],
            "p1": k[2],
            "p2": k[3],
            "aabb_scale": PHONE_AABB_SCALE if phone else AABB_SCALE,
            "scale": SCALE,
            "offset": list(OFFSET),
            "generator": {
                **meta,
                "scene": _scene_tag(scene),
                "world_bounds": list(SyntheticScene.BOUNDS),
                "background": (
                    "floor and sky (opaque RGB)" if phone else "transparent (alpha 0); evaluate over white"
                ),
                "seconds": round(time.perf_counter() - t_start, 2),
            },
            "frames": frames,
        }
        with open(tmp / "transforms.json", "w") as f:
            json.dump(doc, f, indent=2)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "scene")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if verbose:
        took = time.perf_counter() - t_start
        print(f"\n[synthetic] {len(poses)} views in {took:.1f}s -> {out_dir}", file=sys.stderr)
    return transforms


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m nerf_lightning.data.synthetic OUT_DIR [--views 64] [--width 256 --height 256]
    [--seed 0] [--distortion] [--supersample 2] [--hard-views N] [--overwrite] [--rig phone]
    [--scene fruit_bed]``."""
    ap = argparse.ArgumentParser(
        prog="python -m nerf_lightning.data.synthetic",
        description="Render the procedural synthetic scene into an instant-ngp transforms.json + RGBA PNGs.",
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--views", type=int, default=DEFAULT_SCENE["n_views"], help="orbit views (default 64)")
    ap.add_argument("--width", type=int, default=DEFAULT_SCENE["width"])
    ap.add_argument("--height", type=int, default=DEFAULT_SCENE["height"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distortion", action="store_true", help=f"OpenCV lens k1 k2 p1 p2 = {DISTORTION}")
    ap.add_argument("--supersample", type=int, default=2, help="jittered samples per pixel per axis")
    ap.add_argument("--hard-views", type=int, default=0, help="extra close-ups of the most detailed region")
    ap.add_argument("--overwrite", action="store_true", help="regenerate even if a matching scene exists")
    ap.add_argument("--rig", choices=RIGS, default="orbit", help="camera model and layout (see module doc)")
    ap.add_argument("--scene", choices=SCENES, default="default", help="what is rendered (see module doc)")
    args = ap.parse_args(argv)
    path = generate_scene(
        args.out_dir,
        n_views=args.views,
        width=args.width,
        height=args.height,
        seed=args.seed,
        distortion=args.distortion,
        supersample=args.supersample,
        hard_views=args.hard_views,
        overwrite=args.overwrite,
        verbose=True,
        rig=args.rig,
        scene=args.scene,
    )
    print(path)
    return 0
