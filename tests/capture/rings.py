"""Camera rings as a structure-from-motion solve leaves them, for the process app's fake solvers."""

from __future__ import annotations

import math

import numpy as np


def colmap_ring(n: int, turn: np.ndarray | None = None) -> list[np.ndarray]:
    """``n`` COLMAP camera-to-world matrices (OpenCV axes: x right, y down, z forward) on a ring of radius
    2 at height 0.7 around the origin, each looking at it; ``turn`` [3, 3] rotates the whole world (the
    frame a solve picks is arbitrary)."""
    turn = np.eye(3) if turn is None else turn
    out = []
    for i in range(n):
        a = 2 * math.pi * i / n
        eye = np.array([2.0 * math.cos(a), 2.0 * math.sin(a), 0.7])
        fwd = -eye / np.linalg.norm(eye)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        m = np.eye(4)
        m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = (
            turn @ right,
            turn @ np.cross(fwd, right),
            turn @ fwd,
            turn @ eye,
        )
        out.append(m)
    return out
