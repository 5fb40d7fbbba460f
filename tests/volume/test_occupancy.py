"""OccupancyGrid: update schedule, EMA, camera visibility and distributed sync."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runs import run_ranks

from nerf_lightning.ops import reference as ref
from nerf_lightning.volume.occupancy import OccupancyGrid, all_reduce_max


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
    # instant-ngp's minimum optical thickness 0.01 over its minimum step sqrt(3)/1024, to 3 digits
    assert grid.density_threshold == pytest.approx(0.01 * 1024 / math.sqrt(3), abs=5e-3)
    with pytest.raises(ValueError, match=r"^OccupancyGrid.aabb_scale=3: expected a power of two <= 128"):
        OccupancyGrid(aabb_scale=3)
    with pytest.raises(ValueError, match=r"^model.net.renderer.occupancy.resolution=15: .*multiple of 2"):
        OccupancyGrid(resolution=15)


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
    assert grid.threshold == 5.91


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


def test_shares_of_the_cells_merged_by_max_are_one_process_update() -> None:
    """Three processes' shares of a warm-up update, merged by the element-wise max as ``sync_`` merges
    them, give every cell the value one process gives it from all cells: max(decay x old, new) where the
    cell was seen, and each share evaluates a third of the cells. After warm-up each share draws a third of
    each draw, rounded up."""
    g, count = 8, 3
    start = OccupancyGrid(aabb_scale=2, resolution=g, ops="torch")  # 2 cascades, 1024 cells
    old = torch.rand(2, g**3, generator=torch.Generator().manual_seed(4)) * 4.0  # below the new 5.0 / 0.95
    old[:, :40] = -1.0  # unseen by any camera
    start.density_grid.copy_(old)
    merged, counts = None, []
    for index in range(count):
        grid = OccupancyGrid(aabb_scale=2, resolution=g, ops="torch")
        grid.load_state_dict(start.state_dict())
        seen: list[int] = []

        def density(p: torch.Tensor, seen: list[int] = seen) -> torch.Tensor:
            seen.append(p.shape[0])
            return torch.full((p.shape[0],), 5.0)

        gen = torch.Generator().manual_seed(index)
        grid.update(0, density, decay=0.95, share=(index, count), generator=gen)
        counts.append(sum(seen))
        merged = grid.density_grid if merged is None else torch.maximum(merged, grid.density_grid)
    assert counts == [342, 341, 341]  # 1024 cells: every third from 0, 1, 2
    expected = torch.where(old < 0, old, torch.full_like(old, 5.0))  # max(0.95 x old, 5) = 5 where seen
    torch.testing.assert_close(merged, expected, rtol=0, atol=0)

    after: list[int] = []
    start.update(
        300, lambda p: after.append(p.shape[0]) or torch.zeros(p.shape[0]), warmup_steps=256, share=(2, count)
    )
    # per cascade: ceil((G^3 / 4) / 3) = 43 uniform cells + 43 among the occupied ones
    assert sum(after) == 2 * 2 * 43
    with pytest.raises(ValueError, match="share"):
        start.update(300, lambda p: torch.zeros(p.shape[0]), share=(3, 3))


def test_the_cascades_running_counts_are_each_rows_own() -> None:
    """The occupied cells' running count along each cascade, from one scan over all of them: each row
    counted from its own start, as a scan of each row alone counts it."""
    from nerf_lightning.volume.occupancy import _cascade_cdf

    binaries = torch.rand(3, 4096, generator=torch.Generator().manual_seed(5)) < 0.3
    binaries[1] = False  # a cascade without occupied cells
    expected = torch.stack([torch.cumsum(row.long(), 0) for row in binaries]).float()
    cdf = _cascade_cdf(binaries)
    assert cdf.dtype == torch.float32 and torch.equal(cdf, expected)
    assert cdf[1].max() == 0 and cdf[2, -1] == binaries[2].sum()


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


def test_post_warmup_samples_half_of_its_cells_among_occupied_ones() -> None:
    """After warm-up, about half of the sampled positions fall into occupied cells, however few they are
    (uniform sampling would put ~1% there), and every occupied cell gets re-evaluated."""
    g = 16
    grid = OccupancyGrid(aabb_scale=1, resolution=g, ops="torch")
    gen = torch.Generator().manual_seed(7)
    occupied = torch.zeros(g, g, g, dtype=torch.bool)
    cells = torch.randint(0, g, (40, 3), generator=gen)
    occupied[cells[:, 0], cells[:, 1], cells[:, 2]] = True
    grid.binaries.copy_(occupied[None])
    grid.density_grid.copy_(torch.where(occupied.reshape(1, -1), 100.0, 0.0))
    seen: list[torch.Tensor] = []

    def density(p: torch.Tensor) -> torch.Tensor:
        seen.append(p)
        return torch.full((p.shape[0],), 1e3)

    grid.update(1000, density, warmup_steps=256, decay=0.5, generator=gen)
    positions = torch.cat(seen)
    # the cell of each position, computed here: aabb_scale 1 has one cascade over [0, 1]^3
    ijk = (positions * g).floor().long()
    assert ijk.min() >= 0 and ijk.max() < g
    in_occupied = occupied[ijk[:, 0], ijk[:, 1], ijk[:, 2]].double().mean().item()
    frac = occupied.double().mean().item()  # ~1%
    assert in_occupied == pytest.approx(0.5 + 0.5 * frac, abs=0.06), (in_occupied, frac)
    # all 40-odd occupied cells were sampled (the new value 1e3 replaced their decayed 100 * 0.5)
    assert (grid.density_grid[0][occupied.reshape(-1)] == 1e3).all()


def test_post_warmup_occupied_samples_stay_in_their_cascade() -> None:
    """With several cascades, each cascade's occupied cells are the ones re-sampled (flat offsets)."""
    g = 8
    grid = OccupancyGrid(aabb_scale=4, resolution=g, ops="torch")  # 3 cascades
    gen = torch.Generator().manual_seed(8)
    occupied = torch.rand(3, g**3, generator=gen) < 0.02
    occupied[:, 0] = True  # at least one per cascade
    grid.binaries.copy_(occupied.view(3, g, g, g))
    grid.density_grid.copy_(torch.where(occupied, 100.0, 0.0))
    grid.update(1000, lambda p: torch.full((p.shape[0],), 1e3), warmup_steps=256, decay=0.5, generator=gen)
    for c in range(3):
        assert (grid.density_grid[c][occupied[c]] == 1e3).all(), f"cascade {c}: occupied cells not sampled"


# ---------------------------------------------------------------------------------- distributed sync
WORLD = 2


def _sync_worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # OpenMP's thread pool does not survive the fork
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        grid = OccupancyGrid(aabb_scale=2, resolution=8, ops="torch")
        gen = torch.Generator().manual_seed(100 + rank)
        # each rank's own estimate: positive everywhere (so SUM and MAX differ in every cell) ...
        grid.update(0, lambda p: 12.0 * torch.rand(p.shape[0], generator=gen), generator=gen)
        # ... cells no camera sees (-1) on both ranks, and cells only one rank has not seen
        grid.density_grid[:, :50] = -1.0
        grid.density_grid[:, 50 + rank : 100 : 2] = -1.0
        before = {k: v.clone() for k, v in grid.state_dict().items()}
        grid.sync_(all_reduce_max)
        torch.save(
            {"before": before, "after": grid.state_dict(), "threshold": grid.threshold},
            Path(out_dir) / f"rank{rank}.pt",
        )
        dist.barrier()  # neither rank tears its group down while the other may still use it
    finally:
        dist.destroy_process_group()


def test_sync_all_reduces_the_max_over_two_gloo_ranks(tmp_path: Path) -> None:
    """Two real processes call the module's own all-reduce through ``OccupancyGrid.sync_``; both end with
    the element-wise max of the grids they started from and the occupancy of that max."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    # fork: the children inherit the imported torch (see tests/data/test_sampler_ddp.py)
    run_ranks(_sync_worker, (str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))
    a, b = r0["before"]["density_grid"], r1["before"]["density_grid"]
    assert not torch.equal(a, b) and (a > 0).float().mean() > 0.5
    expected = torch.maximum(a, b)
    for r in (r0, r1):
        assert torch.equal(r["after"]["density_grid"], expected)
        assert torch.equal(r["after"]["binaries"], ref.grid_occupancy(expected, r["threshold"]))
    # the cells one rank has not seen take the other rank's value; unseen by both stay -1
    assert (expected[:, 50:100] >= 0).all() and (expected[:, :50] == -1).all()
    # occupancy changed with the sync (it is recomputed, not left as each rank's own)
    assert not torch.equal(r0["after"]["binaries"], r0["before"]["binaries"])
