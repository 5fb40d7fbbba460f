"""The analytic procedural scene: exact ray intersection, procedural textures and Blinn-Phong shading.

World frame (NeRF/Blender): z up, metres-free units. A textured ground disc of radius 1.2 lies at
z = 0; on it stand a rotated checkered box with a glossy gold ball on top, a large glossy striped
"beach ball", a small glossy marble sphere, a striped pillar and a glossy cylinder with a helical
pattern and wood rings on its cap. Everything lies within radius 1.2 of the z axis and below
z = 0.8, so with the NGP transform ``scale = 0.33, offset = 0.5`` the scene is inside the unit cube.

Shading: ambient + two directional lights (Lambert), Blinn-Phong highlights on the glossy objects
(view dependent), hard shadows from the key light. Textures mix several scales (checkers of 0.16 and
0.08, stripes, rings, 4-octave value noise down to a 0.06 period) but nothing finer than a few
pixels of a 128 px view, so the images are detailed without being pure aliasing.

Everything is vectorized float64 numpy over rays; there is no loop over pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["SyntheticScene", "Hit", "value_noise", "fbm"]

_EPS = 1e-6
_INF = np.inf


# ----------------------------------------------------------------------------------------------- noise
def _hash_u32(x: np.ndarray) -> np.ndarray:
    """Integer mixing (lowbias32) of uint32 arrays; wraps modulo 2^32 by design."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _lattice(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int) -> np.ndarray:
    """Pseudo-random value in [0, 1) per integer lattice point (int64 [...] each) -> float64 [...]."""
    h = _hash_u32((ix & 0xFFFFFFFF).astype(np.uint32) ^ np.uint32(seed * 0x9E3779B1 & 0xFFFFFFFF))
    h = _hash_u32(h ^ (iy & 0xFFFFFFFF).astype(np.uint32))
    h = _hash_u32(h ^ (iz & 0xFFFFFFFF).astype(np.uint32))
    return h.astype(np.float64) * (1.0 / 4294967296.0)


def value_noise(p: np.ndarray, seed: int = 0) -> np.ndarray:
    """Smooth 3D value noise in [0, 1]: float [N, 3] points -> float64 [N], period-free, C1 continuous."""
    p = np.asarray(p, dtype=np.float64)
    base = np.floor(p)
    f = p - base
    f = f * f * (3.0 - 2.0 * f)  # smoothstep: no creases at lattice cells
    i = base.astype(np.int64)
    out = np.zeros(p.shape[0])
    for dx in (0, 1):  # 8 lattice corners, not a loop over points
        wx = f[:, 0] if dx else 1.0 - f[:, 0]
        for dy in (0, 1):
            wy = f[:, 1] if dy else 1.0 - f[:, 1]
            for dz in (0, 1):
                wz = f[:, 2] if dz else 1.0 - f[:, 2]
                out += wx * wy * wz * _lattice(i[:, 0] + dx, i[:, 1] + dy, i[:, 2] + dz, seed)
    return out


def fbm(p: np.ndarray, octaves: int = 4, seed: int = 0) -> np.ndarray:
    """Fractal sum of :func:`value_noise`, frequencies doubling, amplitudes halving; float64 [N] in [0, 1]."""
    total, amp, norm = np.zeros(len(p)), 1.0, 0.0
    for o in range(octaves):
        total += amp * value_noise(p * (2.0**o), seed + 17 * o)
        norm += amp
        amp *= 0.5
    return total / norm


def _mix(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per-row blend of colours a, b (float [3] or [N, 3]) by t (float [N]) -> float64 [N, 3]."""
    t = np.asarray(t, dtype=np.float64)[:, None]
    return np.asarray(a) * (1.0 - t) + np.asarray(b) * t


def _smooth_line(dist: np.ndarray, half_width: float) -> np.ndarray:
    """1 on a line of given half width, 0 away from it, with a soft edge of the same width ([N] -> [N])."""
    return np.clip(1.5 - np.abs(dist) / half_width, 0.0, 1.0)


def _rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


# -------------------------------------------------------------------------------------------- objects
@dataclass
class _Material:
    """Blinn-Phong material: specular colour (float [3], 0 = matte) and exponent."""

    specular: tuple[float, float, float] = (0.0, 0.0, 0.0)
    shininess: float = 32.0


@dataclass
class _Primitive:
    name: str
    material: _Material = field(default_factory=_Material)

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Nearest hit distance t > eps along unit rays (float64 [N, 3] each) -> float64 [N], inf = miss."""
        raise NotImplementedError

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        """(centre float64 [3], radius) enclosing the object: rays missing it skip the exact test."""
        raise NotImplementedError

    def intersect_culled(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        """:meth:`intersect`, run only on the rays that pass the cheap bounding-sphere test."""
        cand = _sphere_candidates(o, d, *self.bounding_sphere())
        t = np.full(len(o), _INF)
        if len(cand):
            t[cand] = self.intersect(o[cand], d[cand])
        return t

    def normal(self, p: np.ndarray) -> np.ndarray:
        """Outward unit normal at surface points float64 [N, 3] -> [N, 3]."""
        raise NotImplementedError

    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Diffuse colour at surface points (with their normals) -> float64 [N, 3] in [0, 1]."""
        raise NotImplementedError


def _sphere_candidates(o: np.ndarray, d: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Indices (int64 [M]) of the unit rays (float64 [N, 3] each) that can meet a sphere in front of them."""
    oc = o - center
    b = np.einsum("ij,ij->i", oc, d)
    disc = b * b - (np.einsum("ij,ij->i", oc, oc) - radius * radius)
    return np.flatnonzero((disc >= 0.0) & (-b + np.sqrt(np.maximum(disc, 0.0)) > _EPS))


def _nearest_positive(t0: np.ndarray, t1: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Smallest of two roots that is > eps where ``valid``, else inf (all [N])."""
    t = np.where(t0 > _EPS, t0, np.where(t1 > _EPS, t1, _INF))
    return np.where(valid, t, _INF)


@dataclass
class _Sphere(_Primitive):
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
        return _nearest_positive(-b - s, -b + s, disc >= 0.0)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        return np.asarray(self.center, dtype=np.float64), self.radius * 1.01

    def normal(self, p: np.ndarray) -> np.ndarray:
        return (p - np.asarray(self.center)) / self.radius

    def local(self, p: np.ndarray) -> np.ndarray:
        """Unit-sphere coordinates of surface points in the texture frame ([N, 3])."""
        return ((p - np.asarray(self.center)) / self.radius) @ self.frame.T


@dataclass
class _Box(_Primitive):
    """Box standing upright, rotated by ``angle`` about the vertical axis through its centre."""

    center: tuple[float, float, float] = (0.0, 0.0, 0.0)
    half: tuple[float, float, float] = (0.5, 0.5, 0.5)
    angle: float = 0.0

    def __post_init__(self) -> None:
        self.rotation = _rot_z(self.angle)  # local -> world

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
        return _nearest_positive(tnear, tfar, tfar >= np.maximum(tnear, _EPS))

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
class _Cylinder(_Primitive):
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
                ok = (disc >= 0) & (a > 1e-14) & (t > _EPS) & (z >= self.z0) & (z <= self.z1)
                t_side.append(np.where(ok, t, _INF))
            t_caps = []
            for zc in (self.z0, self.z1):
                t = (zc - o[:, 2]) / d[:, 2]
                x, y = ox + t * d[:, 0], oy + t * d[:, 1]
                ok = (t > _EPS) & (x * x + y * y <= self.radius**2)
                t_caps.append(np.where(ok, t, _INF))
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
class _Disc(_Primitive):
    """Horizontal disc of radius ``radius`` centred on the z axis at height ``z``."""

    radius: float = 1.0
    z: float = 0.0

    def intersect(self, o: np.ndarray, d: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.z - o[:, 2]) / d[:, 2]
        x, y = o[:, 0] + t * d[:, 0], o[:, 1] + t * d[:, 1]
        ok = np.isfinite(t) & (t > _EPS) & (x * x + y * y <= self.radius**2)
        return np.where(ok, t, _INF)

    def bounding_sphere(self) -> tuple[np.ndarray, float]:
        return np.array([0.0, 0.0, self.z]), self.radius * 1.01

    def normal(self, p: np.ndarray) -> np.ndarray:
        n = np.zeros_like(p)
        n[:, 2] = 1.0
        return n


# ------------------------------------------------------------------------------------------- textures
#: radius of the textured ground disc of the default scene; a larger ``floor_radius`` extends it
GROUND_RADIUS = 1.2


class _Ground(_Disc):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        x, y = p[:, 0], p[:, 1]
        r = np.hypot(x, y)
        col = self._disc_albedo(x, y, r)
        floor = r > GROUND_RADIUS
        if floor.any():  # the room's floor around the disc: tiles of 0.5 with grain
            xf, yf = x[floor], y[floor]
            tile = (np.floor(xf / 0.5) + np.floor(yf / 0.5)) % 2
            grain = fbm(np.stack([xf * 2.0, yf * 2.0, np.ones_like(xf)], 1), octaves=3, seed=5)
            col[floor] = _mix((0.62, 0.60, 0.66), (0.40, 0.42, 0.50), tile) * (0.75 + 0.5 * grain)[:, None]
        return col

    @staticmethod
    def _disc_albedo(x: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
        checker = (np.floor(x / 0.16) + np.floor(y / 0.16)) % 2
        col = _mix((0.80, 0.74, 0.62), (0.50, 0.45, 0.40), checker)
        # concentric dark rings every 0.3 (lines ~0.03 wide)
        ring = _smooth_line(((r + 0.15) % 0.3) - 0.15, 0.012)
        col = col * (1.0 - 0.45 * ring)[:, None]
        # low-frequency stains + fine grain from multi-octave noise
        grain = fbm(np.stack([x * 3.0, y * 3.0, np.zeros_like(x)], 1), octaves=4, seed=1)
        col = col * (0.72 + 0.56 * grain)[:, None]
        # outer band: 40 angular segments alternating teal / cream with a red inner border
        theta = np.arctan2(y, x)
        seg = np.floor((theta + np.pi) / (2 * np.pi) * 40) % 2
        band = _mix((0.10, 0.50, 0.52), (0.92, 0.88, 0.74), seg)
        in_band = r > 1.02
        col[in_band] = band[in_band]
        border = _smooth_line(r - 0.99, 0.015)
        col = _mix(col, (0.75, 0.15, 0.12), border)
        return col


class _CheckerBox(_Box):
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
        stripe = _smooth_line(((u + v + 0.1) % 0.4) - 0.2, 0.04)
        col = _mix(col, (0.95, 0.80, 0.20), 0.6 * stripe)
        half = np.asarray(self.half)
        axis = face // 2
        hu, hv = half[(axis + 1) % 3], half[(axis + 2) % 3]
        edge = np.minimum(hu - np.abs(u), hv - np.abs(v))
        col = col * (1.0 - 0.8 * _smooth_line(edge - 0.015, 0.01))[:, None]
        grain = fbm(pl * 6.0, octaves=3, seed=3)
        return col * (0.85 + 0.3 * grain)[:, None]


class _BeachBall(_Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        phi = np.arctan2(q[:, 1], q[:, 0])
        gore = (np.floor((phi + np.pi) / (2 * np.pi) * 8).astype(np.int64)) % 4
        palette = np.array([(0.85, 0.12, 0.10), (0.95, 0.95, 0.92), (0.10, 0.25, 0.80), (0.95, 0.80, 0.10)])
        col = palette[gore]
        lat = np.degrees(np.arcsin(np.clip(q[:, 2], -1, 1)))
        col = _mix(col, (0.08, 0.08, 0.10), _smooth_line(((lat + 7.5) % 15.0) - 7.5, 0.8))
        col[np.abs(q[:, 2]) > 0.93] = (0.95, 0.95, 0.92)
        return col


class _Marble(_Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        veins = 0.5 + 0.5 * np.sin(q[:, 0] * 7.0 + 6.0 * fbm(q * 2.5 + 3.0, octaves=4, seed=5))
        return _mix((0.05, 0.30, 0.20), (0.85, 0.92, 0.88), veins**0.7)


class _GoldBall(_Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        spots = fbm(q * 3.0, octaves=3, seed=7)
        return _mix((0.55, 0.35, 0.08), (0.90, 0.72, 0.30), spots)


class _Pillar(_Box):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        pl = self.to_local(p)
        z = p[:, 2]
        stripes = np.floor(z / 0.1) % 2
        col = _mix((0.80, 0.12, 0.15), (0.95, 0.93, 0.90), stripes)
        top = pl[:, 2] > self.half[2] - 1e-6
        col[top] = (0.20, 0.20, 0.22)
        return col


class _HelixCylinder(_Cylinder):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        rx, ry = p[:, 0] - self.xy[0], p[:, 1] - self.xy[1]
        theta = np.arctan2(ry, rx)
        helix = np.floor(theta / (2 * np.pi) * 6 + p[:, 2] / 0.15) % 2
        col = _mix((0.45, 0.20, 0.60), (0.93, 0.90, 0.82), helix)
        # wood-like rings on the caps, period 0.06, wobbling with noise
        rad = np.hypot(rx, ry)
        wobble = fbm(np.stack([rx * 4.0, ry * 4.0, p[:, 2]], 1), octaves=3, seed=9)
        rings = 0.5 + 0.5 * np.cos(2 * np.pi * (rad / 0.06 + 0.8 * wobble))
        wood = _mix((0.55, 0.33, 0.15), (0.85, 0.65, 0.40), rings)
        cap = np.abs(n[:, 2]) > 0.5
        col[cap] = wood[cap]
        return col


# -------------------------------------------------------------------------------------------- scene
@dataclass(frozen=True)
class Hit:
    """Nearest intersections of N rays: distance t (float64 [N], inf = miss), object index (int64 [N],
    -1 = miss), hit point and outward normal (float64 [N, 3], NaN for misses)."""

    t: np.ndarray
    object_id: np.ndarray
    point: np.ndarray
    normal: np.ndarray


class SyntheticScene:
    """The procedural default scene in world (NeRF) coordinates, z up; see the module docstring.

    Args:
        floor_radius: radius of the ground. Beyond the default disc (1.2) it is a tiled floor: a large
            value puts the objects on a floor that reaches the horizon under a :meth:`sky`, an opaque
            backdrop like a phone capture's, instead of the default scene's transparent background.

    Attributes:
        objects: the primitives, indexed by ``Hit.object_id``.
        glossy: bool [len(objects)], objects with a Blinn-Phong highlight (view-dependent colour).
    """

    #: key light (casts shadows) and fill light: unit direction *towards* the light, intensity
    KEY_DIR = np.array([0.45, -0.55, 0.70]) / np.linalg.norm([0.45, -0.55, 0.70])
    FILL_DIR = np.array([-0.60, 0.50, 0.40]) / np.linalg.norm([-0.60, 0.50, 0.40])
    KEY, FILL, AMBIENT = 0.75, 0.25, 0.25
    #: everything lies in this world-space box (xmin, ymin, zmin, xmax, ymax, zmax) (floor excepted)
    BOUNDS = (-1.2, -1.2, 0.0, 1.2, 1.2, 0.8)
    #: colours of the sky (rays that hit nothing, with ``floor_radius``): at the horizon, at the zenith
    SKY_HORIZON, SKY_ZENITH = (0.86, 0.84, 0.80), (0.42, 0.56, 0.82)

    @property
    def glossy(self) -> np.ndarray:
        """bool [len(objects)]: objects with a Blinn-Phong highlight (derived: scenes replace ``objects``)."""
        return np.array([max(o.material.specular) > 0 for o in self.objects])

    def __init__(self, floor_radius: float = GROUND_RADIUS) -> None:
        tilt = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(0.5), -np.sin(0.5)], [0.0, np.sin(0.5), np.cos(0.5)]])
        tilt = tilt @ _rot_z(0.3)
        box = _CheckerBox("checker_box", center=(-0.45, -0.30, 0.25), half=(0.25, 0.20, 0.25), angle=0.52)
        self.objects: list[_Primitive] = [
            _Ground("ground", radius=max(float(floor_radius), GROUND_RADIUS), z=0.0),
            box,
            _GoldBall(
                "gold_ball", _Material((0.65, 0.52, 0.28), 80.0), center=(-0.45, -0.30, 0.63), radius=0.13
            ),
            _BeachBall(
                "beach_ball",
                _Material((0.55, 0.55, 0.55), 50.0),
                center=(0.40, 0.35, 0.40),
                radius=0.40,
                frame=tilt,
            ),
            _Marble("marble", _Material((0.60, 0.60, 0.60), 120.0), center=(-0.15, 0.70, 0.17), radius=0.17),
            _Pillar("pillar", center=(-0.10, 0.15, 0.35), half=(0.07, 0.07, 0.35), angle=0.2),
            _HelixCylinder(
                "cylinder",
                _Material((0.30, 0.30, 0.30), 25.0),
                xy=(0.55, -0.45),
                radius=0.17,
                z0=0.0,
                z1=0.65,
            ),
        ]
        lo, hi = np.asarray(self.BOUNDS[:3]), np.asarray(self.BOUNDS[3:])
        # sphere around the cylinder |xy| <= 1.2, 0 <= z <= 0.8 that holds every object
        self._bound_center = np.array([0.0, 0.0, 0.5 * (lo[2] + hi[2])])
        self._bound_radius = float(np.hypot(max(hi[0], floor_radius), 0.5 * (hi[2] - lo[2]))) * 1.01
        self.floor_radius = max(float(floor_radius), GROUND_RADIUS)

    # ------------------------------------------------------------------------------------------
    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> Hit:
        """Nearest hit of each ray (float [N, 3] origins, directions of any length) among all objects."""
        o = np.asarray(origins, dtype=np.float64).reshape(-1, 3)
        d = np.asarray(dirs, dtype=np.float64).reshape(-1, 3)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        t = np.full(len(o), _INF)
        obj_id = np.full(len(o), -1, dtype=np.int64)
        # most rays of a view miss the whole scene: only those meeting its bounding sphere are traced
        idx = _sphere_candidates(o, d, self._bound_center, self._bound_radius)
        if len(idx):
            oi, di = o[idx], d[idx]
            ts = np.stack([obj.intersect_culled(oi, di) for obj in self.objects])  # [K, M]
            k = np.argmin(ts, axis=0)
            tk = ts[k, np.arange(len(idx))]
            hit = np.isfinite(tk)
            t[idx[hit]], obj_id[idx[hit]] = tk[hit], k[hit]
        miss = obj_id < 0
        point = o + np.where(miss, np.nan, t)[:, None] * d
        normal = np.full_like(point, np.nan)
        for k, obj in enumerate(self.objects):  # loop over objects; each one's pass is vectorized over rays
            m = obj_id == k
            if m.any():
                normal[m] = obj.normal(point[m])
        return Hit(t=t, object_id=obj_id, point=point, normal=normal)

    def occluded(self, points: np.ndarray, direction: np.ndarray) -> np.ndarray:
        """Whether anything blocks the ray from each point (float [N, 3]) towards ``direction`` ([3])."""
        d = np.broadcast_to(np.asarray(direction, dtype=np.float64), points.shape)
        blocked = np.zeros(len(points), dtype=bool)
        for obj in self.objects:
            blocked |= np.isfinite(obj.intersect_culled(points, d))
        return blocked

    def shade(self, hit: Hit, dirs: np.ndarray) -> np.ndarray:
        """Colour (float64 [N, 3] in [0, 1]; 0 for misses) of the hits seen along ``dirs`` ([N, 3])."""
        d = np.asarray(dirs, dtype=np.float64).reshape(-1, 3)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        rgb = np.zeros((len(d), 3))
        m = hit.object_id >= 0
        if not m.any():
            return rgb
        ids, p, n, view = hit.object_id[m], hit.point[m], hit.normal[m], -d[m]
        # two-sided surfaces: light the side that faces the viewer
        n = np.where((np.einsum("ij,ij->i", n, view) < 0)[:, None], -n, n)
        albedo = np.zeros_like(p)
        spec_col = np.zeros_like(p)
        shininess = np.ones(len(p))
        for k, obj in enumerate(self.objects):
            mk = ids == k
            if mk.any():
                albedo[mk] = obj.albedo(p[mk], n[mk])
                spec_col[mk] = obj.material.specular
                shininess[mk] = obj.material.shininess
        # shadow rays start slightly off the surface to avoid self-intersection
        lit = ~self.occluded(p + 1e-5 * n, self.KEY_DIR)
        diffuse = np.full(len(p), self.AMBIENT)
        spec = np.zeros(len(p))
        for direction, intensity, vis in ((self.KEY_DIR, self.KEY, lit), (self.FILL_DIR, self.FILL, None)):
            ndl = n @ direction
            on = (ndl > 0) if vis is None else (ndl > 0) & vis
            diffuse += intensity * np.where(on, ndl, 0.0)
            half = view + direction
            half /= np.linalg.norm(half, axis=1, keepdims=True)
            ndh = np.clip(np.einsum("ij,ij->i", n, half), 0.0, 1.0)
            spec += intensity * np.where(on, ndh**shininess, 0.0)
        rgb[m] = np.clip(albedo * diffuse[:, None] + spec_col * spec[:, None], 0.0, 1.0)
        return rgb

    def trace(
        self, origins: np.ndarray, dirs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Render rays exactly.

        Args:
            origins: float [N, 3] world-space ray origins.
            dirs: float [N, 3] directions (any positive length; normalized here).

        Returns:
            rgb float64 [N, 3] in [0, 1] (0 on a miss), alpha float64 [N] (1 hit, 0 miss), depth
            float64 [N] (Euclidean distance from the origin to the hit, inf on a miss), hit_point
            float64 [N, 3] (NaN on a miss).
        """
        hit = self.intersect(origins, dirs)
        rgb = self.shade(hit, dirs)
        return rgb, (hit.object_id >= 0).astype(np.float64), hit.t, hit.point

    def sky(self, dirs: np.ndarray) -> np.ndarray:
        """Sky colour (float64 [N, 3]) seen along directions ``dirs`` ([N, 3], any length): a gradient
        from the horizon to the zenith, an environment at infinity (the same from every position)."""
        d = np.asarray(dirs, dtype=np.float64).reshape(-1, 3)
        up = np.clip(d[:, 2] / np.linalg.norm(d, axis=1), 0.0, 1.0)
        return _mix(self.SKY_HORIZON, self.SKY_ZENITH, np.sqrt(up))


# --------------------------------------------------------------------------------- the fruit-bed scene
@dataclass
class _Bed(_Disc):
    """A near-white quilted bed (faint diamond seams, period 0.12, 12% darker) of radius
    ``bed_radius`` at z = 0, on a dark floor that reaches ``radius``: almost nothing to triangulate."""

    bed_radius: float = 8.0

    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        x, y = p[:, 0], p[:, 1]
        col = np.tile(np.array([0.86, 0.85, 0.83]), (len(p), 1))
        u, v = (x + y) / 0.12, (x - y) / 0.12
        seam = np.maximum(_smooth_line((u % 1) - 0.5, 0.08), _smooth_line((v % 1) - 0.5, 0.08))
        col = col * (1 - 0.12 * seam)[:, None]
        col[np.hypot(x, y) > self.bed_radius] = (0.35, 0.30, 0.28)
        return np.clip(col, 0, 1)


class _Apple(_Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        return _mix((0.55, 0.08, 0.06), (0.85, 0.25, 0.12), fbm(self.local(p) * 3.0, octaves=3, seed=21))


class _BananaPart(_Sphere):
    def albedo(self, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        q = self.local(p)
        col = _mix((0.80, 0.65, 0.10), (0.95, 0.85, 0.25), fbm(q * 4.0, octaves=3, seed=22))
        col[value_noise(q * 9.0, seed=23) > 0.8] = (0.35, 0.25, 0.08)  # brown spots
        return col


class FruitBedScene(SyntheticScene):
    """The shared ``fruit`` capture in miniature: a red ball (the apple) and a yellow arc of nine balls
    (the banana) lying on a near-white quilted bed of radius 8 (2.6 NGP units) that fills every phone
    view, on a dark floor under the sky. The objects fill about a third of a phone-rig view, as the
    fruit does.

    Why it exists: without a near plane (``model.renderer.near_plane=0``) the default hash grid fails on
    it as it does on ``fruit`` (held-out PSNR far below the training PSNR), while the default scene on
    the same rig reconstructs with any grid. What it shares with ``fruit`` and the default scene lacks
    is a background with almost no texture: the bed looks the same from wherever it is seen, so the
    training views do not pin its depth, and a grid with enough collision-free fine cells explains each
    view with density of its own instead of one surface. See ``docs/fruit.md``.
    """

    def __init__(
        self, floor_radius: float = 400.0, bed_radius: float = 8.0, object_scale: float = 1.6
    ) -> None:
        super().__init__(floor_radius=floor_radius)
        # object scale 1.6: the apple is 1.2 wide, the whole group 2.6 (0.4 and 0.85 NGP units)
        s = float(object_scale)
        objects: list[_Primitive] = [
            _Bed("bed", radius=self.floor_radius, z=0.0, bed_radius=float(bed_radius)),
            _Apple(
                "apple",
                _Material((0.3, 0.3, 0.3), 40.0),
                center=(0.05 * s, 0.1 * s, 0.38 * s),
                radius=0.38 * s,
            ),
        ]
        for k, ang in enumerate(np.linspace(-2.3, 0.5, 9)):
            rr = 0.20 * s * (1 - 0.5 * abs(ang + 0.9) / 1.4)  # thickest in the middle
            c = (0.05 * s + 0.62 * s * np.cos(ang), 0.1 * s + 0.62 * s * np.sin(ang), rr)
            objects.append(_BananaPart(f"banana{k}", center=c, radius=rr))
        self.objects = objects
