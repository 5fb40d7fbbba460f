"""Chunked, resumable image renders and what the browser is shown of them; the port check; occupied cells."""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import torch

from nerf_lightning.errors import UserError
from nerf_lightning.mesh.extract import occupied_cells
from nerf_lightning.video.camera_paths import PathCamera, camera_rays, look_at
from nerf_lightning.video.writer import turbo
from nerf_lightning.viewer.callback import ViewerCallback
from nerf_lightning.viewer.ports import check_port, next_free_port
from nerf_lightning.viewer.progressive import ChunkSizer, ImageRender, composite
from nerf_lightning.volume.occupancy import OccupancyGrid

CPU = torch.device("cpu")


def _camera(width: int, height: int) -> PathCamera:
    c2w = look_at(np.array([2.0, 0.5, 0.5]), np.array([0.5, 0.5, 0.5]), np.array([0.0, 0.0, 1.0]))
    f = 0.5 * height / math.tan(math.radians(25))
    return PathCamera(c2w, width, height, f, f, width / 2, height / 2)


def _field(rays_o: torch.Tensor, rays_d: torch.Tensor) -> dict[str, torch.Tensor]:
    """A stand-in render: colour from the direction, depth 2, opacity from the direction's z."""
    opacity = (rays_d[:, 2:3] > 0).float() * 0.5 + 0.5
    return {"rgb": (rays_d + 1) / 2, "depth": 2.0 * opacity, "opacity": opacity}


def test_chunks_assemble_the_whole_image() -> None:
    cam = _camera(13, 7)
    image = ImageRender(cam, CPU)
    sizes = []
    while not image.done:
        sizes.append(image.advance(_field, 10))
    assert sizes == [10] * 9 + [1] and image.done_rays == 91
    o, d = camera_rays(cam, CPU)
    whole = _field(o, d)
    rgb, depth, opacity = image.arrays()
    np.testing.assert_allclose(rgb, whole["rgb"].reshape(7, 13, 3).numpy(), atol=1e-6)
    np.testing.assert_allclose(depth, 2.0, atol=1e-6)  # expected depth: depth / opacity
    np.testing.assert_allclose(opacity, whole["opacity"].reshape(7, 13).numpy(), atol=1e-6)


def test_unrendered_rows_show_the_coarse_render() -> None:
    coarse = ImageRender(_camera(4, 2), CPU)
    coarse.advance(_field, 8)
    full = ImageRender(_camera(8, 4), CPU)
    full.advance(_field, 8 * 2 + 3)  # two rows and a bit
    picture, near_far = composite("rgb", full, coarse, None)
    rgb_full = (full.arrays()[0] * 255).round()
    rgb_coarse = (coarse.arrays()[0] * 255).round()
    np.testing.assert_array_equal(picture[:2], rgb_full[:2])  # rendered rows
    np.testing.assert_array_equal(picture[2], np.repeat(rgb_coarse[1], 2, axis=0))  # coarse row 1, 2x wide
    np.testing.assert_array_equal(picture[3], np.repeat(rgb_coarse[1], 2, axis=0))
    assert near_far[0] < 2.0 < near_far[1]


def test_depth_and_accumulation_pictures() -> None:
    image = ImageRender(_camera(6, 4), CPU)
    image.advance(_field, 24)
    depth, near_far = composite("depth", image, None, (1.0, 3.0))
    assert near_far == (1.0, 3.0)
    np.testing.assert_array_equal(
        depth, np.broadcast_to(turbo(np.array(0.5)), depth.shape)
    )  # depth 2 of 1..3
    acc, _ = composite("accumulation", image, None, (1.0, 3.0))
    grey = (image.arrays()[2] * 255).round()
    np.testing.assert_array_equal(acc, np.repeat(grey[..., None], 3, axis=-1))
    with pytest.raises(ValueError, match="normals"):
        composite("normals", image, None, (1.0, 3.0))


def test_chunk_sizer_follows_the_measured_speed() -> None:
    sizer = ChunkSizer(0.02, initial_rays_per_s=1e5, min_rays=100, max_rays=10_000)
    assert sizer.rays_for() == 2000
    assert sizer.rays_for(0.005) == 500  # a shorter budget left: a shorter chunk
    for _ in range(20):
        sizer.record(4000, 0.01)  # 400k rays/s
    assert sizer.rays_for() == pytest.approx(8000, rel=0.01)
    assert sizer.rays_for(1e-9) == 100 and ChunkSizer(1.0, 1e9, max_rays=10_000).rays_for() == 10_000


def test_a_taken_port_is_an_error_that_names_a_free_one() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UserError) as err:
            check_port("127.0.0.1", port)
        msg = str(err.value)
        assert f"port={port}" in msg and "already in use" in msg
        suggested = int(msg.rsplit("port=", 1)[1].split()[0])
        assert suggested > port and suggested == next_free_port("127.0.0.1", port + 1)
    check_port("127.0.0.1", port)  # free again
    with pytest.raises(UserError, match=r"^host=192.0.2.1: not an address of this machine \(cannot assign "):
        check_port("192.0.2.1", port)  # TEST-NET-1 (RFC 5737): on no machine; EADDRNOTAVAIL, not "in use"


def test_the_train_app_s_viewer_names_its_own_keys() -> None:
    """``train viewer=on``: a taken port and a foreign host are named as the train app's keys."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(is_global_zero=True, strategy=None)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UserError) as err:
            ViewerCallback(port=port).setup(trainer, None, "fit")
    taken = f"viewer.port={port}: 127.0.0.1:{port} is already in use (another viewer?); pass viewer.port="
    assert str(err.value).startswith(taken), str(err.value)
    foreign = r"^viewer.host=192.0.2.1: not an address of this machine .* use viewer.host=127.0.0.1 \(this"
    with pytest.raises(UserError, match=foreign):
        ViewerCallback(host="192.0.2.1", port=port).setup(trainer, None, "fit")
    # the range is the key's (viewer/options.Port), checked where it is read: here viewer.port
    with pytest.raises(ValueError, match=r"^viewer.port=70000: expected an integer >= 0 and <= 65535"):
        ViewerCallback(port=70000)


def test_occupied_cells_cover_each_point_once() -> None:
    grid = OccupancyGrid(aabb_scale=2, resolution=4)
    grid.binaries.zero_()
    grid.binaries[0, 1, 2, 3] = True  # cascade 0: cell (1, 2, 3) of the unit cube
    grid.binaries[1, 0, 0, 0] = True  # cascade 1: a corner cell of [-0.5, 1.5]^3
    grid.binaries[1, 1, 1, 1] = True  # inside the unit cube: cascade 0's, not drawn
    centres, cascades = occupied_cells(grid)
    np.testing.assert_allclose(centres.numpy(), [[0.375, 0.625, 0.875], [-0.25, -0.25, -0.25]])
    assert cascades.tolist() == [0, 1]
