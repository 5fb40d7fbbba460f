"""Marching-cubes output made into an asset's geometry: floaters dropped, terraces smoothed, triangles cut.

Three steps, in this order (:func:`clean_mesh`):

1. **Components.** Connected components (sharing an edge) with fewer than ``min_component`` times the
   faces of the largest one are dropped: the floaters that a NeRF leaves in empty space come out as
   small separate islands.
2. **Smoothing.** Taubin's lambda/mu filter (``trimesh.smoothing.filter_taubin``): a low-pass filter on
   the vertex positions that removes the voxel terracing of marching cubes while keeping the volume
   and the face orientations (a plain Laplacian filter shrinks the shape; this one does not).
3. **Decimation.** Quadric-error simplification (``fast-simplification``) to at most ``faces``
   triangles; it keeps the face orientation and spends triangles where the curvature is.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clean_mesh", "keep_large_components"]


def keep_large_components(vertices: np.ndarray, faces: np.ndarray, min_component: float) -> np.ndarray:
    """The faces of the components with at least ``min_component`` x the largest one's face count."""
    import trimesh

    if len(faces) == 0 or min_component <= 0:
        return faces
    adjacency = trimesh.Trimesh(vertices=vertices, faces=faces, process=False).face_adjacency
    labels = trimesh.graph.connected_component_labels(adjacency, node_count=len(faces))
    sizes = np.bincount(labels)
    keep = sizes >= min_component * sizes.max()
    return faces[keep[labels]]


def clean_mesh(
    vertices: np.ndarray,
    faces: np.ndarray,
    min_component: float = 0.05,
    smooth: int = 10,
    max_faces: int | None = 200_000,
) -> tuple[np.ndarray, np.ndarray]:
    """The three steps of the module docstring; returns (vertices float64 [V, 3], faces int64 [F, 3]).

    Args:
        vertices, faces: a triangle mesh, faces counter-clockwise seen from outside.
        min_component: drop components smaller than this fraction of the largest (0: keep all).
        smooth: Taubin iterations (0: none).
        max_faces: at most this many triangles (None: no decimation).
    """
    import trimesh

    faces = keep_large_components(vertices, faces, min_component)
    mesh = trimesh.Trimesh(vertices=vertices, faces=faces, process=False)
    mesh.remove_unreferenced_vertices()
    if smooth > 0:
        trimesh.smoothing.filter_taubin(mesh, iterations=int(smooth))
    vertices, faces = np.asarray(mesh.vertices, np.float64), np.asarray(mesh.faces, np.int64)
    if max_faces is not None and len(faces) > max_faces:
        import fast_simplification

        target = max_faces
        for _ in range(8):  # quadric simplification lands near the target, at times a few faces above
            v, f = fast_simplification.simplify(vertices, faces, target_reduction=1.0 - target / len(faces))
            if len(f) <= max_faces:
                break
            target = int(target * 0.98)
        mesh = trimesh.Trimesh(vertices=v, faces=f, process=False)
        mesh.remove_unreferenced_vertices()
        vertices, faces = np.asarray(mesh.vertices, np.float64), np.asarray(mesh.faces, np.int64)
    return vertices, faces
