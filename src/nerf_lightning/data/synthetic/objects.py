"""The textured objects of the default scene and of the fruit-bed scene (procedural albedos)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nerf_lightning.data.synthetic.noise import fbm, mix, smooth_line, value_noise
from nerf_lightning.data.synthetic.primitives import Box, Cylinder, Disc, Sphere

__all__ = [
    "GROUND_RADIUS",
    "Apple",
    "BananaPart",
    "BeachBall",
    "Bed",
    "CheckerBox",
    "GoldBall",
    "Ground",
    "HelixCylinder",
    "Marble",
    "Pillar",
]


#: radius of the textured ground disc of the default scene; a larger ``floor_radius`` extends it
GROUND_RADIUS = 1.2


class Ground(Disc):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        x, y = p[:, 0], p[:, 1]
        r = np.hypot(x, y)
        col = self._disc_albedo(x, y, r)
        floor = r > GROUND_RADIUS
        if floor.any():  # the room's floor around the disc: tiles of 0.5 with grain
            xf, yf = x[floor], y[floor]
            tile = (np.floor(xf / 0.5) + np.floor(yf / 0.5)) % 2
            grain = fbm(np.stack([xf * 2.0, yf * 2.0, np.ones_like(xf)], 1), octaves=3, seed=5)
            col[floor] = mix((0.62, 0.60, 0.66), (0.40, 0.42, 0.50), tile) * (0.75 + 0.5 * grain)[:, None]
        return col

    @staticmethod
    def _disc_albedo(x: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
        checker = (np.floor(x / 0.16) + np.floor(y / 0.16)) % 2
        col = mix((0.80, 0.74, 0.62), (0.50, 0.45, 0.40), checker)
        # concentric dark rings every 0.3 (lines ~0.03 wide)
        ring = smooth_line(((r + 0.15) % 0.3) - 0.15, 0.012)
        col = col * (1.0 - 0.45 * ring)[:, None]
        # low-frequency stains + fine grain from multi-octave noise
        grain = fbm(np.stack([x * 3.0, y * 3.0, np.zeros_like(x)], 1), octaves=4, seed=1)
        col = col * (0.72 + 0.56 * grain)[:, None]
        # outer band: 40 angular segments alternating teal / cream with a red inner border
        theta = np.arctan2(y, x)
        seg = np.floor((theta + np.pi) / (2 * np.pi) * 40) % 2
        band = mix((0.10, 0.50, 0.52), (0.92, 0.88, 0.74), seg)
        in_band = r > 1.02
        col[in_band] = band[in_band]
        border = smooth_line(r - 0.99, 0.015)
        col = mix(col, (0.75, 0.15, 0.12), border)
        return col


class CheckerBox(Box):
    """Each face its own colour pair, 0.08 checkers, a dark frame and a big diagonal stripe."""

    _PAIRS = (
        ((0.15, 0.30, 0.75), (0.90, 0.90, 0.95)),
        ((0.85, 0.45, 0.10), (0.95, 0.90, 0.80)),
        ((0.20, 0.60, 0.25), (0.90, 0.95, 0.85)),
        ((0.70, 0.15, 0.45), (0.95, 0.85, 0.90)),
        ((0.40, 0.40, 0.45), (0.85, 0.80, 0.30)),
        ((0.10, 0.55, 0.65), (0.95, 0.95, 0.90)),
    )

    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        pl = self.to_local(p)
        face, u, v = self.face_uv(pl)
        pairs = np.asarray(self._PAIRS)  # [6, 2, 3]
        checker = ((np.floor(u / 0.08) + np.floor(v / 0.08)) % 2).astype(np.int64)
        col = pairs[face, checker]
        # a broad diagonal stripe across every face: structure at a scale between checker and face
        stripe = smooth_line(((u + v + 0.1) % 0.4) - 0.2, 0.04)
        col = mix(col, (0.95, 0.80, 0.20), 0.6 * stripe)
        half = np.asarray(self.half)
        axis = face // 2
        hu, hv = half[(axis + 1) % 3], half[(axis + 2) % 3]
        edge = np.minimum(hu - np.abs(u), hv - np.abs(v))
        col = col * (1.0 - 0.8 * smooth_line(edge - 0.015, 0.01))[:, None]
        grain = fbm(pl * 6.0, octaves=3, seed=3)
        return col * (0.85 + 0.3 * grain)[:, None]


class BeachBall(Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        phi = np.arctan2(q[:, 1], q[:, 0])
        gore = (np.floor((phi + np.pi) / (2 * np.pi) * 8).astype(np.int64)) % 4
        palette = np.array([(0.85, 0.12, 0.10), (0.95, 0.95, 0.92), (0.10, 0.25, 0.80), (0.95, 0.80, 0.10)])
        col = palette[gore]
        lat = np.degrees(np.arcsin(np.clip(q[:, 2], -1, 1)))
        col = mix(col, (0.08, 0.08, 0.10), smooth_line(((lat + 7.5) % 15.0) - 7.5, 0.8))
        col[np.abs(q[:, 2]) > 0.93] = (0.95, 0.95, 0.92)
        return col


class Marble(Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        veins = 0.5 + 0.5 * np.sin(q[:, 0] * 7.0 + 6.0 * fbm(q * 2.5 + 3.0, octaves=4, seed=5))
        return mix((0.05, 0.30, 0.20), (0.85, 0.92, 0.88), veins**0.7)


class GoldBall(Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        spots = fbm(q * 3.0, octaves=3, seed=7)
        return mix((0.55, 0.35, 0.08), (0.90, 0.72, 0.30), spots)


class Pillar(Box):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        pl = self.to_local(p)
        z = p[:, 2]
        stripes = np.floor(z / 0.1) % 2
        col = mix((0.80, 0.12, 0.15), (0.95, 0.93, 0.90), stripes)
        top = pl[:, 2] > self.half[2] - 1e-6
        col[top] = (0.20, 0.20, 0.22)
        return col


class HelixCylinder(Cylinder):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        rx, ry = p[:, 0] - self.xy[0], p[:, 1] - self.xy[1]
        theta = np.arctan2(ry, rx)
        helix = np.floor(theta / (2 * np.pi) * 6 + p[:, 2] / 0.15) % 2
        col = mix((0.45, 0.20, 0.60), (0.93, 0.90, 0.82), helix)
        # wood-like rings on the caps, period 0.06, wobbling with noise
        rad = np.hypot(rx, ry)
        wobble = fbm(np.stack([rx * 4.0, ry * 4.0, p[:, 2]], 1), octaves=3, seed=9)
        rings = 0.5 + 0.5 * np.cos(2 * np.pi * (rad / 0.06 + 0.8 * wobble))
        wood = mix((0.55, 0.33, 0.15), (0.85, 0.65, 0.40), rings)
        cap = np.abs(n[:, 2]) > 0.5
        col[cap] = wood[cap]
        return col


@dataclass
class Bed(Disc):
    """A near-white quilted bed (faint diamond seams, period 0.12, 12% darker) of radius
    ``bed_radius`` at z = 0, on a dark floor that reaches ``radius``: almost nothing to triangulate."""

    bed_radius: float = 8.0

    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        x, y = p[:, 0], p[:, 1]
        col = np.tile(np.array([0.86, 0.85, 0.83]), (len(p), 1))
        u, v = (x + y) / 0.12, (x - y) / 0.12
        seam = np.maximum(smooth_line((u % 1) - 0.5, 0.08), smooth_line((v % 1) - 0.5, 0.08))
        col = col * (1 - 0.12 * seam)[:, None]
        col[np.hypot(x, y) > self.bed_radius] = (0.35, 0.30, 0.28)
        return np.clip(col, 0, 1)


class Apple(Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        return mix((0.55, 0.08, 0.06), (0.85, 0.25, 0.12), fbm(self.local(p) * 3.0, octaves=3, seed=21))


class BananaPart(Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        col = mix((0.80, 0.65, 0.10), (0.95, 0.85, 0.25), fbm(q * 4.0, octaves=3, seed=22))
        col[value_noise(q * 9.0, seed=23) > 0.8] = (0.35, 0.25, 0.08)  # brown spots
        return col
