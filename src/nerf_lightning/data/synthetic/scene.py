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

from dataclasses import dataclass

import numpy as np

from nerf_lightning.data.synthetic.noise import fbm, mix, rot_z, value_noise
from nerf_lightning.data.synthetic.objects import (
    GROUND_RADIUS,
    Apple,
    BananaPart,
    BeachBall,
    Bed,
    CheckerBox,
    GoldBall,
    Ground,
    HelixCylinder,
    Marble,
    Pillar,
)
from nerf_lightning.data.synthetic.primitives import INF, Material, Primitive, sphere_candidates

__all__ = ["FruitBedScene", "Hit", "SyntheticScene", "fbm", "value_noise"]


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
        tilt = tilt @ rot_z(0.3)
        box = CheckerBox("checker_box", center=(-0.45, -0.30, 0.25), half=(0.25, 0.20, 0.25), angle=0.52)
        self.objects: list[Primitive] = [
            Ground("ground", radius=max(float(floor_radius), GROUND_RADIUS), z=0.0),
            box,
            GoldBall(
                "gold_ball", Material((0.65, 0.52, 0.28), 80.0), center=(-0.45, -0.30, 0.63), radius=0.13
            ),
            BeachBall(
                "beach_ball",
                Material((0.55, 0.55, 0.55), 50.0),
                center=(0.40, 0.35, 0.40),
                radius=0.40,
                frame=tilt,
            ),
            Marble("marble", Material((0.60, 0.60, 0.60), 120.0), center=(-0.15, 0.70, 0.17), radius=0.17),
            Pillar("pillar", center=(-0.10, 0.15, 0.35), half=(0.07, 0.07, 0.35), angle=0.2),
            HelixCylinder(
                "cylinder",
                Material((0.30, 0.30, 0.30), 25.0),
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
        t = np.full(len(o), INF)
        obj_id = np.full(len(o), -1, dtype=np.int64)
        # most rays of a view miss the whole scene: only those meeting its bounding sphere are traced
        idx = sphere_candidates(o, d, self._bound_center, self._bound_radius)
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
        return mix(self.SKY_HORIZON, self.SKY_ZENITH, np.sqrt(up))


class FruitBedScene(SyntheticScene):
    """The shared ``fruit`` capture in miniature: a red ball (the apple) and a yellow arc of nine balls
    (the banana) lying on a near-white quilted bed of radius 8 (2.6 NGP units) that fills every phone
    view, on a dark floor under the sky. The objects fill about a third of a phone-rig view, as the
    fruit does.

    Why it exists: without a near plane (``model.net.renderer.near_plane=0``) the default hash grid fails on
    it as it does on ``fruit`` (held-out PSNR far below the training PSNR), while the default scene on
    the same rig reconstructs with any grid. What it shares with ``fruit`` and the default scene lacks
    is a background with almost no texture: the bed looks the same from wherever it is seen, so the
    training views do not pin its depth, and a grid with enough collision-free fine cells explains each
    view with density of its own instead of one surface. See
    ``docs/investigations/2026-11-30-fruit-failure.md``.
    """

    def __init__(
        self, floor_radius: float = 400.0, bed_radius: float = 8.0, object_scale: float = 1.6
    ) -> None:
        super().__init__(floor_radius=floor_radius)
        # object scale 1.6: the apple is 1.2 wide, the whole group 2.6 (0.4 and 0.85 NGP units)
        s = float(object_scale)
        objects: list[Primitive] = [
            Bed("bed", radius=self.floor_radius, z=0.0, bed_radius=float(bed_radius)),
            Apple(
                "apple",
                Material((0.3, 0.3, 0.3), 40.0),
                center=(0.05 * s, 0.1 * s, 0.38 * s),
                radius=0.38 * s,
            ),
        ]
        for k, ang in enumerate(np.linspace(-2.3, 0.5, 9)):
            rr = 0.20 * s * (1 - 0.5 * abs(ang + 0.9) / 1.4)  # thickest in the middle
            c = (0.05 * s + 0.62 * s * np.cos(ang), 0.1 * s + 0.62 * s * np.sin(ang), rr)
            objects.append(BananaPart(f"banana{k}", center=c, radius=rr))
        self.objects = objects
