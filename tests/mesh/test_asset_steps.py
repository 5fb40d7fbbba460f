"""The asset steps on analytic meshes: components, decimation, smoothing, UV bake, padding, axes, files."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("trimesh")

import torch
import trimesh

from nerf_lightning.mesh.clean import clean_mesh
from nerf_lightning.mesh.formats import encode, to_up, write_files
from nerf_lightning.mesh.texture import (
    bake_texture,
    dilate,
    rasterize_uv,
    spatial_blocks,
    surface_colors,
    unwrap,
)


def _two_balls() -> tuple[np.ndarray, np.ndarray]:
    """A ball of radius 1 (1280 faces) and a floater of radius 0.1 (80 faces) beside it."""
    big = trimesh.creation.icosphere(subdivisions=3, radius=1.0)
    small = trimesh.creation.icosphere(subdivisions=1, radius=0.1)
    small.apply_translation([3.0, 0, 0])
    both = trimesh.util.concatenate([big, small])
    return np.asarray(both.vertices), np.asarray(both.faces)


def test_small_components_are_dropped_and_the_face_count_is_cut() -> None:
    vertices, faces = _two_balls()
    v, f = clean_mesh(vertices, faces, min_component=0.1, smooth=0, max_faces=None)
    assert len(f) == 1280 and v[:, 0].max() < 1.01  # the floater (80 < 0.1 * 1280 faces) is gone
    v, f = clean_mesh(vertices, faces, min_component=0.05, smooth=0, max_faces=None)
    assert len(f) == 1360  # 80 >= 0.05 * 1280: kept
    v, f = clean_mesh(vertices, faces, min_component=0.1, smooth=0, max_faces=300)
    assert 200 <= len(f) <= 300
    mesh = trimesh.Trimesh(v, f)
    assert mesh.is_watertight and mesh.volume == pytest.approx(4 / 3 * np.pi, rel=0.05)  # outward faces


def test_smoothing_removes_terraces_and_keeps_the_volume() -> None:
    import mcubes

    x, y, z = np.mgrid[-1:1:40j, -1:1:40j, -1:1:40j]
    verts, faces = mcubes.marching_cubes((x**2 + y**2 + z**2 < 0.6**2).astype(np.float64), 0.5)  # terraced
    verts = verts * (2 / 39) - 1
    rough = np.linalg.norm(verts, axis=1).std()
    v, f = clean_mesh(verts, faces.astype(np.int64), min_component=0.0, smooth=10, max_faces=None)
    r = np.linalg.norm(v, axis=1)
    assert r.std() < 0.6 * rough  # rounder
    assert r.mean() == pytest.approx(np.linalg.norm(verts, axis=1).mean(), rel=0.02)  # no shrinking


def _colour_of_position(points: np.ndarray) -> np.ndarray:
    return np.clip(0.5 + 0.4 * points, 0, 1)


def test_bake_puts_each_texels_surface_colour_at_its_uv_and_pads_the_seams() -> None:
    ball = trimesh.creation.icosphere(subdivisions=3, radius=1.0)
    vmap, faces, uv = unwrap(np.asarray(ball.vertices), np.asarray(ball.faces), 256)
    vertices, normals = np.asarray(ball.vertices)[vmap], np.asarray(ball.vertex_normals)[vmap]
    assert uv.min() >= 0 and uv.max() <= 1 and len(faces) == 1280
    seen_normals = []

    def colours(points: np.ndarray, n: np.ndarray) -> np.ndarray:
        seen_normals.append(n)
        return _colour_of_position(points)

    texture = bake_texture(vertices, faces, normals, uv, 256, colours)
    assert texture.shape == (256, 256, 3) and texture.dtype == np.uint8
    assert (texture.sum(axis=-1) > 0).all()  # padding: no black texel left anywhere
    # interpolated normals point outwards, as the surface points do
    n = seen_normals[0]
    assert (np.einsum("ij,ij->i", n, n) > 0.9).all()
    # sample the texture at the centroid of every face: the colour of that point of the ball
    centroid_uv = uv[faces].mean(axis=1)
    cols = np.clip((centroid_uv[:, 0] * 256).astype(int), 0, 255)
    rows = np.clip(((1 - centroid_uv[:, 1]) * 256).astype(int), 0, 255)
    expected = _colour_of_position(vertices[faces].mean(axis=1)) * 255
    assert np.abs(texture[rows, cols] - expected).max() < 6


def test_spatial_blocks_group_faces_by_the_grid_cell_of_their_centroid() -> None:
    # one small triangle near each corner of the unit cube: 8 faces, at most 1 a block -> a 2x2x2 grid
    corners = np.array([[x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], float)
    tri = np.array([[0, 0, 0], [0.1, 0, 0], [0, 0.1, 0]])
    vertices = np.concatenate([np.clip(c + tri * (1 - 2 * c), 0, 1) for c in corners])
    faces = np.arange(24).reshape(8, 3)
    blocks = spatial_blocks(vertices, faces, max_faces=1)
    assert sorted(len(b) for b in blocks) == [1] * 8
    assert sorted(np.concatenate(blocks).tolist()) == list(range(8))
    blocks = spatial_blocks(vertices, faces, max_faces=8)  # k = 1: one block of all
    assert len(blocks) == 1 and sorted(blocks[0].tolist()) == list(range(8))
    blocks = spatial_blocks(vertices, faces, max_faces=4)  # k = ceil(2 ** (1/3)) = 2 again
    assert len(blocks) == 8


def test_unwrap_in_blocks_keeps_every_face_and_packs_the_blocks_without_overlap() -> None:
    ball = trimesh.creation.icosphere(subdivisions=4, radius=1.0)  # 5120 faces
    v, f = np.asarray(ball.vertices), np.asarray(ball.faces)
    vmap, faces, uv = unwrap(v, f, 512, block_faces=400)
    assert len(spatial_blocks(v, f, 400)) > 8 and len(faces) == 5120

    # the same triangles in space, each with its winding (the first vertex may rotate)
    def canonical(tris: np.ndarray) -> set:
        out = set()
        for t in np.round(tris, 6):
            i = min(range(3), key=lambda k: tuple(t[k]))
            out.add(tuple(map(tuple, np.roll(t, -i, axis=0))))
        return out

    assert canonical(v[vmap][faces]) == canonical(v[f])
    assert uv.min() >= 0 and uv.max() <= 1
    # no two charts share texels: the texels covered equal the charts' summed area (one shared atlas;
    # blocks packed each on their own would overlap and cover less than their sum)
    a, b, c = (uv[faces][:, k] for k in range(3))
    area = 0.5 * np.abs((b - a)[:, 0] * (c - a)[:, 1] - (b - a)[:, 1] * (c - a)[:, 0]).sum()
    face_id, _ = rasterize_uv(uv, faces, 2048)
    covered = (face_id >= 0).mean()
    assert 0.3 < area < 1 and covered == pytest.approx(area, rel=0.1)


def test_dilate_fills_from_the_nearest_covered_texel() -> None:
    image = np.zeros((4, 6, 3), np.float32)
    covered = np.zeros((4, 6), bool)
    image[1, 1], covered[1, 1] = (1, 0, 0), True
    image[2, 4], covered[2, 4] = (0, 1, 0), True
    out = dilate(image, covered)
    assert tuple(out[0, 0]) == (1, 0, 0) and tuple(out[3, 5]) == (0, 1, 0) and tuple(out[1, 1]) == (1, 0, 0)


def test_surface_colours_come_from_rays_arriving_head_on() -> None:
    """A renderer stub that reports the ray: the origin lies offset + near plane out along the normal,
    the direction is minus the normal, and the colour is divided by the ray's opacity."""
    seen = {}

    def render(o: torch.Tensor, d: torch.Tensor) -> dict[str, torch.Tensor]:
        seen["o"], seen["d"] = o.clone(), d.clone()
        opacity = torch.tensor([[0.5], [0.01]])
        return {"rgb": torch.tensor([[0.2, 0.1, 0.3], [0.0, 0.0, 0.0]]), "opacity": opacity}

    def field(p: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(len(p)), torch.full((len(p), 3), 0.7)

    points = np.array([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])
    normals = np.array([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    rgb = surface_colors(render, field, points, normals, 0.01, 0.2, 16, torch.device("cpu"))
    np.testing.assert_allclose(seen["o"].numpy(), [[0.5, 0.5, 0.71], [0.31, 0.2, 0.3]], atol=1e-6)
    np.testing.assert_allclose(seen["d"].numpy(), [[0, 0, -1], [-1, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(rgb, [[0.4, 0.2, 0.6], [0.7, 0.7, 0.7]], atol=1e-6)  # /0.5; missed: field


def test_surface_colours_average_the_most_head_on_cameras_weighted_by_cosine_to_the_power() -> None:
    """One point at the origin, normal +z, three cameras: straight above (cos 1), at 60 degrees (cos 0.5)
    and below the surface (cos -1, never chosen with views=2). The stub colours a ray red when it
    comes from straight above and blue otherwise; the head-on fallback ray is green. With power 2 the
    mean is (1 * red + 0.25 * blue + 1e-6 * green) / 1.250001."""
    seen = {}

    def render(o: torch.Tensor, d: torch.Tensor) -> dict[str, torch.Tensor]:
        seen["d"] = d.clone()
        rgb = torch.zeros(len(d), 3)
        rgb[:, 2] = 1.0
        rgb[d[:, 0].abs() < 1e-6, 2] = 0.0  # from above (the camera and the normal ray): red / green
        rgb[:, 0] = (d[:, 0].abs() < 1e-6).float()
        rgb[-1] = torch.tensor([0.0, 1.0, 0.0])  # the last ray is the fallback along the normal
        return {"rgb": rgb, "opacity": torch.ones(len(d), 1)}

    def field(p: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise AssertionError("every ray saw the surface")

    s60, c60 = np.sin(np.pi / 3), np.cos(np.pi / 3)
    cameras = np.array([[0.0, 0.0, 2.0], [-3 * s60, 0.0, 3 * c60], [0.0, 0.0, -1.0]])
    rgb = surface_colors(render, field, np.zeros((1, 3)), np.array([[0.0, 0.0, 1.0]]), 0.01, 0.0, 64,
                         torch.device("cpu"), cameras=cameras, views=2, power=2.0)  # fmt: skip
    np.testing.assert_allclose(seen["d"].numpy(), [[0, 0, -1], [s60, 0, -c60], [0, 0, -1]], atol=1e-6)
    np.testing.assert_allclose(rgb, [[1 / 1.250001, 1e-6 / 1.250001, 0.25 / 1.250001]], atol=1e-6)


def test_up_axis_and_the_files_of_each_format(tmp_path) -> None:
    np.testing.assert_allclose(to_up(np.array([[1.0, 2.0, 3.0]]), "y"), [[1.0, 3.0, -2.0]])
    np.testing.assert_allclose(to_up(np.array([[1.0, 2.0, 3.0]]), "z"), [[1.0, 2.0, 3.0]])
    ball = trimesh.creation.icosphere(subdivisions=2)
    vmap, faces, uv = unwrap(np.asarray(ball.vertices), np.asarray(ball.faces), 64)
    texture = np.full((64, 64, 3), (10, 200, 30), np.uint8)
    files = encode("obj", np.asarray(ball.vertices)[vmap], faces, uv=uv, texture=texture)
    assert list(files)[-1] == "mesh.obj" and "mesh.mtl" in files
    assert any(name.endswith(".png") for name in files) and b"map_Kd" in files["mesh.mtl"]
    write_files(tmp_path, files)
    loaded = trimesh.load(tmp_path / "mesh.obj", force="mesh")
    assert len(loaded.faces) == len(faces) and loaded.visual.uv is not None
    glb = encode("glb", np.asarray(ball.vertices)[vmap], faces, uv=uv, texture=texture)["mesh.glb"]
    scene = trimesh.load(io.BytesIO(glb), file_type="glb")
    (mesh,) = scene.geometry.values()
    assert mesh.visual.material.baseColorTexture.size == (64, 64)
    # a write that fails leaves none of the files it wrote
    bad = {"a.png": b"x", "sub/../../nope/\0.obj": b"y"}
    with pytest.raises((OSError, ValueError)):
        write_files(tmp_path / "w", bad)
    assert not (tmp_path / "w" / "a.png").exists()
