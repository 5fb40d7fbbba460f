"""OccupancyGrid: update schedule, EMA, camera visibility and distributed sync."""

from __future__ import annotations

import math

import pytest
import torch

from nerf_lightning.ops import reference as ref
from nerf_lightning.render.occupancy import DEFAULT_THRESHOLD, OccupancyGrid


def sphere_density(centre=(0.5, 0.5, 0.5), radius: float = 0.25, sigma: float = 100.0):
    c = torch.tensor(centre)

    def fn(p: torch.Tensor) -> torch.Tensor:
        return torch.where((p - c).norm(dim=-1) < radius, sigma, 0.0)

    return fn


def test_construction_and_properties() -> None:
    grid = OccupancyGrid(aabb_scale=4, resolution=16)
    assert grid.n_cascades == 3
    assert grid.density_grid.shape == (3, 16**3) and grid.density_grid.dtype == torch.float32
    assert grid.binaries.shape == (3, 16, 16, 16) and grid.binaries.all()
    torch.testing.assert_close(grid.aabb, torch.tensor([-1.5, -1.5, -1.5, 2.5, 2.5, 2.5]))
    assert grid.occupied_fraction() == 1.0
    assert set(grid.state_dict()) == {"density_grid", "binaries"}
    assert DEFAULT_THRESHOLD == pytest.approx(0.01 * 1024 / math.sqrt(3))
    with pytest.raises(ValueError, match="power of two"):
        OccupancyGrid(aabb_scale=3)


def test_warmup_update_marks_the_sphere() -> None:
    g = 16
    grid = OccupancyGrid(aabb_scale=2, resolution=g)
    seen: list[torch.Tensor] = []
    fn = sphere_density()

    def density(p: torch.Tensor) -> torch.Tensor:
        seen.append(p)
        return fn(p)

    grid.update(0, density, chunk_size=1000, generator=torch.Generator().manual_seed(0))
    positions = torch.cat(seen)
    assert positions.shape == (2 * g**3, 3) and len(seen) == math.ceil(2 * g**3 / 1000)
    # every cell of cascade 0 was sampled inside itself
    idx, _ = ref.grid_cell_indices(positions[: g**3], 2, g)
    assert torch.equal(idx, torch.arange(g**3))
    # cells fully inside the sphere are occupied, cells fully outside are not
    centres = ref.grid_cell_positions(torch.arange(2 * g**3), torch.full((2 * g**3, 3), 0.5), g)
    dist = (centres - 0.5).norm(dim=-1)
    half_diag = math.sqrt(3) / 2 / g * torch.tensor([1.0, 2.0]).repeat_interleave(g**3)
    occ = grid.binaries.reshape(-1)
    assert occ[dist + half_diag < 0.25].all()
    assert not occ[dist - half_diag > 0.25].any()
    assert 0.0 < grid.occupied_fraction() < 0.1
    assert grid.threshold == pytest.approx(DEFAULT_THRESHOLD)


def test_post_warmup_sampling_and_decay() -> None:
    g = 8
    grid = OccupancyGrid(aabb_scale=2, resolution=g)
    grid.update(0, sphere_density(), generator=torch.Generator().manual_seed(1))
    before = grid.density_grid.clone()
    counts: list[int] = []

    def zero_density(p: torch.Tensor) -> torch.Tensor:
        counts.append(p.shape[0])
        return torch.zeros(p.shape[0])

    grid.update(300, zero_density, warmup_steps=256, decay=0.9, generator=torch.Generator().manual_seed(2))
    # per cascade: G^3/4 uniform cells + G^3/4 among the occupied ones (both cascades hold occupied cells)
    assert sum(counts) == 2 * 2 * (g**3 // 4)
    torch.testing.assert_close(grid.density_grid, before * 0.9)
    # a cascade without occupied cells only learns from its uniform samples
    grid.binaries[1] = False
    before = grid.density_grid.clone()

    def one_density(p: torch.Tensor) -> torch.Tensor:
        return torch.ones(p.shape[0])

    grid.update(301, one_density, decay=0.5, generator=torch.Generator().manual_seed(3))
    uniform = torch.Generator().manual_seed(3)  # the update draws its uniform cells first
    cells = torch.randint(0, g**3, (2, g**3 // 4), generator=uniform)[1]
    touched = torch.zeros(g**3, dtype=torch.bool)
    touched[cells] = True
    expected = torch.where(touched, torch.maximum(before[1] * 0.5, torch.ones(())), before[1] * 0.5)
    torch.testing.assert_close(grid.density_grid[1], expected)


def _camera_looking_at_centre(z: float = -2.0) -> torch.Tensor:
    """NGP-space c2w of an OpenCV camera at (0.5, 0.5, z) looking along +z."""
    c2w = torch.eye(4)
    c2w[:3, 3] = torch.tensor([0.5, 0.5, z])
    return c2w


def test_mark_invisible_cells() -> None:
    g = 16
    grid = OccupancyGrid(aabb_scale=4, resolution=g)
    c2w = _camera_looking_at_centre()[None]
    # 100x100 image, focal 500: half field of view tan = 0.1 -> at z in [2, 4] the view is ~0.4-0.8 wide
    intr = torch.tensor([[500.0, 500.0, 50.0, 50.0, 0, 0, 0, 0, 0, 0]])
    seen = grid.mark_invisible_cells(c2w, intr, [100], [100])
    centres = ref.grid_cell_positions(torch.arange(3 * g**3), torch.full((3 * g**3, 3), 0.5), g)
    seen = seen.reshape(-1)
    # the optical axis inside the box is seen, the corners and the region behind the camera are not
    on_axis = ((centres[:, :2] - 0.5).abs() < 0.02).all(-1) & (centres[:, 2] > -1.9)
    far_off = ((centres[:, :2] - 0.5).abs() > 1.0).any(-1) | (centres[:, 2] < -2.2)
    assert seen[on_axis].all() and not seen[far_off].any()
    assert 0.0 < seen.float().mean() < 0.2
    dg = grid.density_grid.reshape(-1)
    assert (dg[~seen] == -1).all() and (dg[seen] == 0).all()
    assert not grid.binaries.reshape(-1)[~seen].any() and grid.binaries.reshape(-1)[seen].all()
    # unseen cells never become occupied, even where the density is huge
    grid.update(0, lambda p: torch.full((p.shape[0],), 1e4))
    assert (grid.density_grid.reshape(-1)[~seen] == -1).all()
    assert torch.equal(grid.binaries.reshape(-1), seen)


def test_sync_takes_the_max_over_ranks() -> None:
    a = OccupancyGrid(resolution=8)
    b = OccupancyGrid(resolution=8)
    a.update(
        0, sphere_density(centre=(0.3, 0.5, 0.5), radius=0.15), generator=torch.Generator().manual_seed(4)
    )
    b.update(
        0, sphere_density(centre=(0.7, 0.5, 0.5), radius=0.15), generator=torch.Generator().manual_seed(5)
    )
    grid_a, grid_b = a.density_grid.clone(), b.density_grid.clone()

    def fake_all_reduce(other: torch.Tensor):
        return lambda t: t.copy_(torch.maximum(t, other))

    a.sync_(fake_all_reduce(grid_b))
    b.sync_(fake_all_reduce(grid_a))
    assert torch.equal(a.density_grid, b.density_grid) and torch.equal(a.binaries, b.binaries)
    torch.testing.assert_close(a.density_grid, torch.maximum(grid_a, grid_b))
    # both spheres are occupied after the sync
    x_occupied = a.binaries[0].any(dim=(1, 2))
    assert x_occupied[2] and x_occupied[5] and not x_occupied[0]
