"""The scene's shapes: exact ray intersection with spheres, boxes, cylinders and discs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nerf_lightning.data.synthetic.noise import rot_z

__all__ = ["EPS", "INF", "Box", "Cylinder", "Disc", "Material", "Primitive", "Sphere", "sphere_candidates"]

EPS = 1e-6
INF = np.inf


@dataclass
class Material:
    """Blinn-Phong material: specular colour (float [3], 0 = matte) and exponent."""

    specular: tuple[float, float, float] = (0.0, 0.0, 0.0)
    shininess: float = 32.0


@dataclass
class Primitive:
    name: str
    material: Material = field(default_factory=Material)

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Nearest hit distance t > eps along unit rays (float64 [N, 3] each) -> float64 [N], inf = miss."""
        raise NotImplementedError

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        """(centre float64 [3], radius) enclosing the object: rays missing it skip the exact test."""
        raise NotImplementedError

    def intersect_culled(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        """:meth:`intersect`, run only on the rays that pass the cheap bounding-sphere test."""
        cand = sphere_candidates(o, d, *self.bounding_sphere())
        t = np.full(len(o), INF)
        if len(cand):
            t[cand] = self.intersect(o[cand], d[cand])
        return t

    def normal(self, p: np.ndarray) -> np.ndarray:
        """Outward unit normal at surface points float64 [N, 3] -> [N, 3]."""
        raise NotImplementedError

    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Diffuse colour at surface points (with their normals) -> float64 [N, 3] in [0, 1]."""
        raise NotImplementedError


def sphere_candidates(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Indices (int64 [M]) of the unit rays (float64 [N, 3] each) that can meet a sphere in front of them."""
    oc = o - center
    b = np.einsum("ij,ij->i", oc, d)
    disc = b * b - (np.einsum("ij,ij->i", oc, oc) - radius * radius)
    return np.flatnonzero((disc >= 0.0) & (-b + np.sqrt(np.maximum(disc, 0.0)) > EPS))


def nearest_positive(t0: np.ndarray, t1: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Smallest of two roots that is > eps where ``valid``, else inf (all [N])."""
    t = np.where(t0 > EPS, t0, np.where(t1 > EPS, t1, INF))
    return np.where(valid, t, INF)


@dataclass
class Sphere(Primitive):
    center: tuple[float, float, float] = (0.0, 0.0, 0.0)
    radius: float = 1.0
    #: texture frame: rows are the local axes in world coordinates (lets the pattern be tilted)
    frame: np.ndarray = field(default_factory=lambda: np.eye(3))

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        oc = o - np.asarray(self.center)
        b = np.einsum("ij,ij->i", oc, d)
        c = np.einsum("ij,ij->i", oc, oc) - self.radius**2
        disc = b * b - c
        s = np.sqrt(np.maximum(disc, 0.0))
        return nearest_positive(-b - s, -b + s, disc >= 0.0)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        return np.asarray(self.center, dtype=np.float64), self.radius * 1.01

    def normal(self, p: np.ndarray) -> np.ndarray:
        return (p - np.asarray(self.center)) / self.radius

    def local(self, p: np.ndarray) -> np.ndarray:
        """Unit-sphere coordinates of surface points in the texture frame ([N, 3])."""
        return ((p - np.asarray(self.center)) / self.radius) @ self.frame.T


@dataclass
class Box(Primitive):
    """Box standing upright, rotated by ``angle`` about the vertical axis through its centre."""

    center: tuple[float, float, float] = (0.0, 0.0, 0.0)
    half: tuple[float, float, float] = (0.5, 0.5, 0.5)
    angle: float = 0.0

    def __post_init__(self) -> None:
        self.rotation = rot_z(self.angle)  # local -> world

    def to_local(self, p: np.ndarray, direction: bool = False) -> np.ndarray:
        """World points (or directions) float64 [N, 3] -> box frame (explicit: tiny matmuls are slow)."""
        q = p if direction else p - np.asarray(self.center)
        c, s = self.rotation[0, 0], self.rotation[1, 0]
        return np.stack([c * q[:, 0] + s * q[:, 1], -s * q[:, 0] + c * q[:, 1], q[:, 2]], axis=1)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        return np.asarray(self.center, dtype=np.float64), float(np.linalg.norm(self.half)) * 1.01

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        ol, dl = self.to_local(o), self.to_local(d, direction=True)
        half = np.asarray(self.half)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / dl
            ta, tb = (-half - ol) * inv, (half - ol) * inv
        # fmin/fmax ignore the NaN of 0 * inf (ray parallel to and on a slab plane).
        tnear = np.fmin(ta, tb).max(axis=1)
        tfar = np.fmax(ta, tb).min(axis=1)
        return nearest_positive(tnear, tfar, tfar >= np.maximum(tnear, EPS))

    def face_axis(self, pl: np.ndarray) -> np.ndarray:
        """Index (int [N]) of the slab axis a local surface point lies on."""
        return np.argmax(np.abs(pl) / np.asarray(self.half), axis=1)

    def normal(self, p: np.ndarray) -> np.ndarray:
        pl = self.to_local(p)
        axis = self.face_axis(pl)
        nl = np.zeros_like(pl)
        rows = np.arange(len(pl))
        nl[rows, axis] = np.sign(pl[rows, axis])
        return nl @ self.rotation.T

    def face_uv(self, pl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(face id 0..5 = axis*2 + (sign>0), u, v) of local surface points; u, v in box units."""
        axis = self.face_axis(pl)
        rows = np.arange(len(pl))
        face = axis * 2 + (pl[rows, axis] > 0)
        u = pl[rows, (axis + 1) % 3]
        v = pl[rows, (axis + 2) % 3]
        return face, u, v


@dataclass
class Cylinder(Primitive):
    """Vertical capped cylinder: axis through (x, y), from z0 to z1."""

    xy: tuple[float, float] = (0.0, 0.0)
    radius: float = 0.5
    z0: float = 0.0
    z1: float = 1.0

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        ox, oy = o[:, 0] - self.xy[0], o[:, 1] - self.xy[1]
        a = d[:, 0] ** 2 + d[:, 1] ** 2
        b = ox * d[:, 0] + oy * d[:, 1]
        c = ox * ox + oy * oy - self.radius**2
        disc = b * b - a * c
        s = np.sqrt(np.maximum(disc, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t_side = []
            for t in ((-b - s) / a, (-b + s) / a):
                z = o[:, 2] + t * d[:, 2]
                ok = (disc >= 0) & (a > 1e-14) & (t > EPS) & (z >= self.z0) & (z <= self.z1)
                t_side.append(np.where(ok, t, INF))
            t_caps = []
            for zc in (self.z0, self.z1):
                t = (zc - o[:, 2]) / d[:, 2]
                x, y = ox + t * d[:, 0], oy + t * d[:, 1]
                ok = (t > EPS) & (x * x + y * y <= self.radius**2)
                t_caps.append(np.where(ok, t, INF))
        return np.minimum.reduce(t_side + t_caps)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        c = np.array([self.xy[0], self.xy[1], 0.5 * (self.z0 + self.z1)])
        return c, float(np.hypot(self.radius, 0.5 * (self.z1 - self.z0))) * 1.01

    def normal(self, p: np.ndarray) -> np.ndarray:
        rx, ry = p[:, 0] - self.xy[0], p[:, 1] - self.xy[1]
        rad = np.sqrt(rx * rx + ry * ry)
        # Whichever surface the point is closest to; ties only on the rim, where either is fine.
        d_side, d_top, d_bot = np.abs(rad - self.radius), np.abs(p[:, 2] - self.z1), np.abs(p[:, 2] - self.z0)
        n = np.stack([rx / np.maximum(rad, 1e-12), ry / np.maximum(rad, 1e-12), np.zeros_like(rad)], axis=1)
        top = (d_top < d_side) & (d_top <= d_bot)
        bot = (d_bot < d_side) & ~top
        n[top] = (0.0, 0.0, 1.0)
        n[bot] = (0.0, 0.0, -1.0)
        return n


@dataclass
class Disc(Primitive):
    """Horizontal disc of radius ``radius`` centred on the z axis at height ``z``."""

    radius: float = 1.0
    z: float = 0.0

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.z - o[:, 2]) / d[:, 2]
        x, y = o[:, 0] + t * d[:, 0], o[:, 1] + t * d[:, 1]
        ok = np.isfinite(t) & (t > EPS) & (x * x + y * y <= self.radius**2)
        return np.where(ok, t, INF)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        return np.array([0.0, 0.0, self.z]), self.radius * 1.01

    def normal(self, p: np.ndarray) -> np.ndarray:
        n = np.zeros_like(p)
        n[:, 2] = 1.0
        return n
