"""Issue 9 experiments: fruit-like scenes on the phone rig with knobs (bed texture, objects, walls,
per-view gain, views). The rows of BENCHMARKS.md "a generated capture that fails like fruit" were made
with it (``f2v40`` = ``--views 40 --bed quilt --bed-radius 8 --obj-scale 1.6``, which equals
``python -m nerf_lightning.data.synthetic OUT --rig phone --scene fruit_bed --views 40 --width 37
--height 50`` bit for bit). An experiment tool, not part of the package::

    python scripts/issue9/fruit_scene_knobs.py /tmp/fg/f2w --bed white --bed-radius 8 --obj-scale 1.6
"""

import argparse
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from PIL import Image

from nerf_lightning.data.synthetic import generate as G
from nerf_lightning.data.synthetic import scene as S


@dataclass
class Bed(S._Bed):
    """The fruit-bed scene's bed (``quilt``) or another texture of the same colour on the same floor."""

    texture: str = "quilt"  # quilt | white | checker | noise

    def albedo(self, p, n):
        if self.texture == "quilt":
            return super().albedo(p, n)
        x, y = p[:, 0], p[:, 1]
        col = np.tile(np.array([0.86, 0.85, 0.83]), (len(p), 1))
        if self.texture == "noise":  # high-frequency colourful noise at all scales
            g = S.fbm(np.stack([x * 8, y * 8, np.zeros_like(x)], 1), octaves=5, seed=11)
            h = S.fbm(np.stack([x * 8, y * 8, np.ones_like(x)], 1), octaves=5, seed=12)
            col = S._mix((0.2, 0.3, 0.7), (0.9, 0.8, 0.3), g) * (0.5 + h)[:, None]
        elif self.texture == "checker":
            c = (np.floor(x / 0.3) + np.floor(y / 0.3)) % 2
            col = S._mix((0.62, 0.60, 0.66), (0.40, 0.42, 0.50), c)
        col[np.hypot(x, y) > self.bed_radius] = (0.35, 0.30, 0.28)
        return np.clip(col, 0, 1)


class Wall(S._Primitive):
    """Vertical plane x*cos+y*sin = dist, textured."""

    def __init__(self, name, az, dist, texture):
        super().__init__(name)
        self.nrm = np.array([math.cos(az), math.sin(az), 0.0])
        self.dist = dist
        self.texture = texture

    def intersect(self, o, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.dist - o @ self.nrm) / (d @ self.nrm)
        return np.where(np.isfinite(t) & (t > 1e-6), t, np.inf)

    def intersect_culled(self, o, d):
        return self.intersect(o, d)

    def normal(self, p):
        return np.tile(-self.nrm, (len(p), 1))

    def albedo(self, p, n):
        side = np.array([-self.nrm[1], self.nrm[0], 0.0])
        u, v = p @ side, p[:, 2]
        if self.texture == "noise":
            g = S.fbm(np.stack([u * 6, v * 6, np.full_like(u, 3.0)], 1), octaves=5, seed=31)
            return S._mix((0.1, 0.1, 0.15), (0.95, 0.9, 0.8), g)
        return np.tile(np.array([0.80, 0.80, 0.78]), (len(p), 1))


def make_scene(a):
    """The package's fruit-bed scene (``--objects fruit``) or the default objects (``default``) or none,
    on a bed of ``--bed`` texture, optionally inside four walls."""
    if a.objects == "fruit":
        sc = S.FruitBedScene(floor_radius=400.0, bed_radius=a.bed_radius, object_scale=a.obj_scale)
    else:
        sc = S.SyntheticScene(floor_radius=400.0)
    objs = [Bed("bed", radius=400.0, z=0.0, bed_radius=a.bed_radius, texture=a.bed)]
    if a.objects in ("fruit", "default"):
        objs += sc.objects[1:]  # everything but the ground
    if a.walls:
        for k in range(4):
            objs.append(Wall(f"wall{k}", k * math.pi / 2, a.wall_dist, a.walls))
    sc.objects = objs
    sc._bound_radius = 1e6
    lit_objs = [o for o in objs if not isinstance(o, Wall)]

    def occluded(points, direction):
        d = np.broadcast_to(np.asarray(direction, dtype=np.float64), points.shape)
        blocked = np.zeros(len(points), dtype=bool)
        for obj in lit_objs:
            blocked |= np.isfinite(obj.intersect_culled(points, d))
        return blocked

    sc.occluded = occluded
    return sc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--views", type=int, default=81)
    ap.add_argument("--width", type=int, default=37)
    ap.add_argument("--height", type=int, default=50)
    ap.add_argument("--bed", default="quilt")
    ap.add_argument("--bed-radius", type=float, default=3.0)
    ap.add_argument("--objects", default="fruit")
    ap.add_argument("--obj-scale", type=float, default=1.0)
    ap.add_argument("--walls", default="")
    ap.add_argument("--wall-dist", type=float, default=6.0)
    ap.add_argument("--gain", type=float, default=0.0, help="per-view gain spread, e.g. 0.2 -> 0.8..1.2")
    ap.add_argument("--dist", default="3.2,4.8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ss", type=int, default=2)
    a = ap.parse_args()
    sc = make_scene(a)
    w, h = a.width, a.height
    fx, fy = G.PHONE_FX_PER_WIDTH * w, G.PHONE_FY_PER_WIDTH * w
    cx, cy = G.PHONE_CX_PER_WIDTH * w, G.PHONE_CY_PER_HEIGHT * h
    poses = G.phone_poses(a.views, a.seed)
    lo, hi = map(float, a.dist.split(","))
    if (lo, hi) != (3.2, 4.8):
        rng = np.random.default_rng([a.seed, 9])
        for i in range(len(poses)):
            fwd = -poses[i][:3, 2]
            eye = poses[i][:3, 3]
            # keep look-at target: move eye along the viewing axis to the new distance
            tgt = eye + fwd * np.linalg.norm(eye - G._LOOK_AT)
            poses[i][:3, 3] = tgt - fwd * rng.uniform(lo, hi)
    out = Path(a.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    grng = np.random.default_rng([a.seed, 7])
    gains = np.exp(grng.uniform(-a.gain, a.gain, a.views)) if a.gain else np.ones(a.views)

    def one(i):
        rgba = G.render_view(
            sc,
            poses[i],
            (fx, fy, cx, cy),
            w,
            h,
            G.PHONE_LENS,
            a.ss,
            np.random.default_rng([a.seed, 3, i]),
            sky=True,
        )
        iio.imwrite(
            out / f"images/{i:04d}.png",
            np.round(np.clip(rgba[..., :3] * gains[i], 0, 1) * 255).astype(np.uint8),
        )

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(one, range(a.views)))
    doc = {
        "fl_x": fx,
        "fl_y": fy,
        "cx": cx,
        "cy": cy,
        "w": w,
        "h": h,
        "k1": G.PHONE_LENS[0],
        "k2": G.PHONE_LENS[1],
        "p1": G.PHONE_LENS[2],
        "p2": G.PHONE_LENS[3],
        "aabb_scale": 32,
        "scale": G.SCALE,
        "offset": list(G.OFFSET),
        "frames": [
            {"file_path": f"images/{i:04d}.png", "transform_matrix": p.tolist()} for i, p in enumerate(poses)
        ],
    }
    (out / "transforms.json").write_text(json.dumps(doc))
    ims = [
        np.asarray(Image.open(out / f"images/{i:04d}.png").resize((w * 3, h * 3), Image.NEAREST))
        for i in range(0, a.views, max(1, a.views // 12))
    ][:12]
    iio.imwrite(out / "montage.png", np.concatenate(ims, 1))


if __name__ == "__main__":
    main()
