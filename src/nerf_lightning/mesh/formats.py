"""A finished mesh as files: glTF binary, OBJ + MTL + PNG, PLY; the up axis; all-or-nothing writes.

- ``glb``: one mesh, one PBR material (metallic 0, roughness 1) whose base-colour texture is the baked
  PNG; without a texture the vertex colours (``COLOR_0``).
- ``obj``: ``mesh.obj`` with ``mesh.mtl`` (``map_Kd``) and the texture PNG next to it.
- ``ply``: binary PLY with per-vertex colours (the texture, if any, is not used).

Axes (:func:`to_up`): NeRF captures (Blender's synthetic scenes, instant-ngp and nerfstudio files) are
+Z up; glTF is +Y up (and so are Blender's and most engines' OBJ importers). ``up="y"`` rotates the
capture's frame about +X, (x, y, z) -> (x, z, -y), a rotation, so units, handedness and the face
orientation stay; ``up="z"`` keeps the capture's own axes.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["FORMATS", "encode", "to_up", "write_files"]

#: format -> the name of its main file
FORMATS = {"glb": "mesh.glb", "obj": "mesh.obj", "ply": "mesh.ply"}


def to_up(points: np.ndarray, up: str) -> np.ndarray:
    """Capture-frame (+Z up) points [N, 3] in the ``up`` convention (see the module docstring)."""
    if up == "z":
        return points
    if up == "y":
        return np.stack([points[:, 0], points[:, 2], -points[:, 1]], axis=-1)
    raise ValueError(f"up={up!r}: expected y or z")


def _trimesh(vertices: np.ndarray, faces: np.ndarray, uv: np.ndarray | None, texture: np.ndarray | None,
             colors: np.ndarray | None):  # fmt: skip
    import trimesh
    from PIL import Image

    if texture is not None and uv is not None:
        material = trimesh.visual.material.PBRMaterial(
            name="baked",
            baseColorTexture=Image.fromarray(texture),
            metallicFactor=0.0,
            roughnessFactor=1.0,
        )
        visual = trimesh.visual.TextureVisuals(uv=uv, material=material)
        return trimesh.Trimesh(vertices=vertices, faces=faces, visual=visual, process=False)
    rgba = None
    if colors is not None:
        rgba = np.concatenate([colors, np.full((len(colors), 1), 255, np.uint8)], axis=1)
    return trimesh.Trimesh(vertices=vertices, faces=faces, vertex_colors=rgba, process=False)


def encode(
    fmt: str,
    vertices: np.ndarray,
    faces: np.ndarray,
    uv: np.ndarray | None = None,
    texture: np.ndarray | None = None,
    colors: np.ndarray | None = None,
) -> dict[str, bytes]:
    """The files of one mesh in format ``fmt``: {file name: content}, the main file (:data:`FORMATS`) last.

    Args:
        vertices float [V, 3], faces int [F, 3]; uv float [V, 2] with texture uint8 [H, W, 3]; colors
        uint8 [V, 3] (per-vertex, used where there is no texture and always by ``ply``).
    """
    if fmt == "ply":
        mesh = _trimesh(vertices, faces, None, None, colors)
        return {FORMATS["ply"]: _as_bytes(mesh.export(file_type="ply"))}
    mesh = _trimesh(vertices, faces, uv, texture, colors)
    if fmt == "glb":
        return {FORMATS["glb"]: _as_bytes(mesh.export(file_type="glb"))}
    if fmt == "obj":
        from trimesh.exchange.obj import export_obj

        text, files = export_obj(
            mesh, include_normals=True, include_texture=True, return_texture=True, mtl_name="mesh.mtl"
        )
        out = {name: _as_bytes(data) for name, data in files.items()}
        out[FORMATS["obj"]] = text.encode()
        return out
    raise ValueError(f"format={fmt!r}: expected one of {', '.join(FORMATS)}")


def _as_bytes(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    return data if isinstance(data, bytes) else io.BytesIO(data).getvalue()


def write_files(folder: Path, files: dict[str, bytes]) -> list[Path]:
    """Write ``files`` into ``folder``, each atomically, in order (the main file last, so a reader that
    finds it finds its texture); when one fails, the ones this call wrote are removed and it raises."""
    written: list[Path] = []
    try:
        for name, data in files.items():
            path = folder / name
            atomic_write_bytes(path, data)
            written.append(path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written
