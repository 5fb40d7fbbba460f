"""Mesh extraction on an analytic field: a ball of known radius, cut by the occupancy grid."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nerf_lightning.mesh.extract import extract_mesh, occupied_bounds, occupied_mask
from nerf_lightning.volume.occupancy import OccupancyGrid

CENTRE = torch.tensor([0.45, 0.5, 0.55])
RADIUS = 0.2


def _density(p: torch.Tensor) -> torch.Tensor:
    """50 at the centre falling linearly to 0 at 2*RADIUS: the iso-level 25 is the sphere |p - c| = RADIUS."""
    return 50.0 * (1.0 - (p - CENTRE).norm(dim=-1) / (2 * RADIUS)).clamp(min=0)


def _field(p: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # colour = where the viewer looks from: red when looking along +x, so outside-in views of the
    # sphere's +x side (direction -x) are blue-ish and of the -x side red-ish
    rgb = torch.stack([(d[:, 0] > 0).float(), torch.zeros(len(p)), (d[:, 0] <= 0).float()], dim=-1)
    return _density(p), rgb


def test_ball_mesh_radius_orientation_colours() -> None:
    grid = OccupancyGrid(aabb_scale=1, resolution=16)  # all cells occupied
    mesh = extract_mesh(_field, _density, grid, resolution=48, threshold=25.0, bounds=[0, 0, 0, 1, 1, 1])
    r = np.linalg.norm(mesh.vertices - CENTRE.numpy(), axis=1)
    np.testing.assert_allclose(r, RADIUS, atol=1.5 / 48)
    tri = mesh.vertices[mesh.faces]
    normals = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    outward = tri.mean(axis=1) - CENTRE.numpy()
    assert (np.einsum("ij,ij->i", normals, outward) > 0).mean() > 0.99  # counter-clockwise from outside
    east = mesh.vertices[:, 0] > CENTRE[0].item() + 0.05
    west = mesh.vertices[:, 0] < CENTRE[0].item() - 0.05
    assert (mesh.colors[east] == [0, 0, 255]).all() and (mesh.colors[west] == [255, 0, 0]).all()


def test_mesh_is_cut_to_occupied_cells() -> None:
    grid = OccupancyGrid(aabb_scale=1, resolution=16)
    grid.binaries[0, 8:] = False  # cells with x >= 0.5 are empty
    pts = torch.tensor([[0.3, 0.5, 0.5], [0.7, 0.5, 0.5], [1.2, 0.5, 0.5]])
    assert occupied_mask(grid, pts).tolist() == [True, False, False]  # outside the box: not occupied
    assert occupied_bounds(grid) == pytest.approx((0, 0, 0, 9 / 16, 1, 1))
    mesh = extract_mesh(_field, _density, grid, resolution=48, threshold=25.0)  # bounds: occupied box
    assert mesh.vertices[:, 0].max() <= 0.5 + 1e-6
    assert mesh.vertices[:, 0].min() == pytest.approx(CENTRE[0].item() - RADIUS, abs=1.5 / 48)
    grid.binaries.zero_()
    with pytest.raises(ValueError, match="no occupied cell"):
        extract_mesh(_field, _density, grid)
