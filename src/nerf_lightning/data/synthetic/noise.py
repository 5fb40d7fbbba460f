"""Procedural noise and the small colour helpers of the scene's textures (vectorized float64 numpy)."""

from __future__ import annotations

import numpy as np

__all__ = ["fbm", "mix", "rot_z", "smooth_line", "value_noise"]


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


def mix(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per-row blend of colours a, b (float [3] or [N, 3]) by t (float [N]) -> float64 [N, 3]."""
    t = np.asarray(t, dtype=np.float64)[:, None]
    return np.asarray(a) * (1.0 - t) + np.asarray(b) * t


def smooth_line(dist: np.ndarray, half_width: float) -> np.ndarray:
    """1 on a line of given half width, 0 away from it, with a soft edge of the same width ([N] -> [N])."""
    return np.clip(1.5 - np.abs(dist) / half_width, 0.0, 1.0)


def rot_z(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
