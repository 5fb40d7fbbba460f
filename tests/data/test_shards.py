"""``data.shard`` and ``data.storage`` (``data/shards.py``, ``data/host_pixels.py``).

- gloo ranks (2 and 4): each holds about 1/N of the training pixels and the union of their shards is
  exactly the training set, pixel for pixel;
- the draws of all ranks together, each weighted by its gradient weight ``N * P_r``, follow the
  sampler's distribution over all views (a binomial tolerance of 5 standard deviations per view);
- ``storage=host`` gives the same batches as ``storage=device`` on the CPU, bit for bit;
- the DataModule state (the sampler) of one rank of 2 resumes on 1 rank.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runs import run_ranks

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.sampler import LossWeightedRaySampler, UniformRaySampler
from nerf_lightning.data.shards import ShardDraw, balanced_shards
from tests.ray_batches import present_fields

N_FRAMES, SIZE = 26, (16, 12)  # test_every=8 holds out frames 0, 8, 16, 24: 22 training views
N_TRAIN = 22


def _datamodule(path: Path, **kw: object) -> NeRFDataModule:
    samplers = {"uniform": UniformRaySampler, "loss_weighted": LossWeightedRaySampler}
    args = dict(
        path=str(path), batch_size=64, image_workers=1, cache_dir=str(path / "cache"), samplers=samplers
    )
    dm = NeRFDataModule(**args, **kw)  # type: ignore[arg-type]
    dm.setup("fit")
    return dm


def _worker(rank: int, world: int, init_file: str, path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(100 + rank)
        dm = _datamodule(Path(path), sampler="loss_weighted")
        dm.ensure_device(torch.device("cpu"))
        sampler = dm.sampler
        assert isinstance(sampler, LossWeightedRaySampler)
        # a non-uniform global distribution (the same on every rank, as after an all-reduced window)
        weights = torch.linspace(1.0, 3.0, N_TRAIN, dtype=torch.float64) ** 2
        sampler._set_distribution(weights / weights.sum())
        counts = torch.zeros(N_TRAIN, dtype=torch.float64)
        for _ in range(40):
            batch = dm.train_batch(2000)
            counts += torch.bincount(batch.view_ids, minlength=N_TRAIN).double()
        held = dm.train_pixels.held_views
        torch.save(
            {
                "views": held,
                "pixels": dm.train_set.pixels.clone(),
                "offsets": dm.train_set.offsets.clone(),
                "counts": counts,
                "weight": float(dm.feedback.shard_weight),
                "probs": sampler.view_probs.clone(),
                "n_train_views": dm.n_train_views,
            },
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_hold_their_shards_and_draw_the_global_distribution(
    make_ngp, tmp_path: Path, world: int
) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    path = make_ngp(n=N_FRAMES, size=SIZE)
    whole = _datamodule(path)  # one process: every training view (fills the image cache first)
    per_view = SIZE[0] * SIZE[1]
    assert whole.train_set.pixels.shape[0] == N_TRAIN * per_view
    run_ranks(_worker, (world, str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=world)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    # sizes: 22 equal views over N ranks, ceil or floor of 22 / N views each
    for r in ranks:
        assert r["n_train_views"] == N_TRAIN
        assert r["pixels"].shape[0] == len(r["views"]) * per_view
        assert len(r["views"]) in (N_TRAIN // world, -(-N_TRAIN // world))
    # the union is exactly the training set: each view once, pixel for pixel
    views = torch.cat([r["views"] for r in ranks])
    assert sorted(views.tolist()) == list(range(N_TRAIN))
    full = whole.train_set
    for r in ranks:
        for local, view in enumerate(r["views"].tolist()):
            mine = r["pixels"][int(r["offsets"][local]) : int(r["offsets"][local]) + per_view]
            start = int(full.offsets[view])
            assert torch.equal(mine, full.pixels[start : start + per_view])

    # every rank holds the same global distribution; its weight is N times its shard's mass
    p = ranks[0]["probs"]
    for r in ranks:
        assert torch.equal(r["probs"], p)
        assert r["weight"] == pytest.approx(world * float(p[r["views"]].sum()), rel=1e-6)
        # a rank draws only from its shard
        outside = torch.ones(N_TRAIN, dtype=torch.bool)
        outside[r["views"]] = False
        assert float(r["counts"][outside].sum()) == 0.0
    # combined, weighted draws follow p: n draws per rank, rank r's view v drawn with p_v / P_r
    n = float(ranks[0]["counts"].sum())
    estimate = sum(r["weight"] * r["counts"] for r in ranks) / (world * n)
    for r in ranks:
        mass = float(p[r["views"]].sum())
        for v in r["views"].tolist():
            q = float(p[v]) / mass
            sigma = r["weight"] * math.sqrt(n * q * (1 - q)) / (world * n)
            assert abs(float(estimate[v]) - float(p[v])) < 5 * sigma, (v, float(estimate[v]), float(p[v]))


def test_balanced_shards_by_pixel_count() -> None:
    # one large view and many small ones: balanced by pixels, not by view count
    counts = [1000, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100]
    shards = balanced_shards(counts, 2)
    assert sorted(v for s in shards for v in s) == list(range(11))
    assert [sum(counts[v] for v in s) for s in shards] == [1000, 1000]
    assert shards == [[0], list(range(1, 11))]
    assert balanced_shards(counts, 2, mode=False) == [list(range(11))]
    assert balanced_shards(counts, 1) == [list(range(11))]
    with pytest.raises(ValueError, match="data.shard"):
        balanced_shards([5, 5], 3)


def test_weighted_shard_draws_are_unbiased_for_unequal_shards() -> None:
    """Views of unequal sizes under a non-uniform distribution: the shards' masses differ (weights
    != 1) and the weighted union of per-shard draws still follows the distribution."""
    torch.manual_seed(0)
    widths = torch.tensor([30, 20, 10, 40, 25, 5, 15])
    heights = torch.tensor([10, 10, 10, 10, 10, 10, 10])
    p = torch.tensor([0.3, 0.05, 0.1, 0.2, 0.15, 0.05, 0.15], dtype=torch.float64)
    world, n = 3, 60000
    shards = balanced_shards((widths * heights).tolist(), world)
    estimate = torch.zeros(7, dtype=torch.float64)
    weights = []
    for views in shards:
        index = torch.tensor(views)
        draw = ShardDraw(index, widths[index], heights[index], world)
        view_ids, local, px, py = draw.sample(p, n)
        assert torch.equal(view_ids, index[local])
        assert bool((px < widths[view_ids]).all()) and bool((py < heights[view_ids]).all())
        weights.append(float(draw.weight))
        estimate += float(draw.weight) * torch.bincount(view_ids, minlength=7).double() / (world * n)
    assert sum(weights) / world == pytest.approx(1.0, rel=1e-6)
    assert max(weights) - min(weights) > 0.1  # unequal masses: the weighting matters here
    torch.testing.assert_close(estimate, p, atol=0.006, rtol=0)  # ~5 sigma at n = 60000


def test_host_storage_gives_the_device_batches(make_ngp) -> None:
    path = make_ngp(n=N_FRAMES, size=SIZE)
    batches = {}
    for storage in ("device", "host"):
        dm = _datamodule(path, storage=storage, pixel_jitter=True)
        dm.ensure_device(torch.device("cpu"))
        assert (dm.train_pixels.host is not None) == (storage == "host")
        torch.manual_seed(7)
        batches[storage] = [present_fields(dm.train_batch(500)) for _ in range(3)]
    for a, b in zip(batches["device"], batches["host"], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_host_storage_holds_the_pixels_once(make_ngp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning copies the pixels (on a GPU machine); the view set keeps the pinned copy, not a second one."""
    from nerf_lightning.data import host_pixels

    monkeypatch.setattr(host_pixels, "_pinned", lambda t: t.clone())  # what pin_memory() does: a new tensor
    dm = _datamodule(make_ngp(n=N_FRAMES, size=SIZE), storage="host")
    dm.ensure_device(torch.device("cpu"))
    host = dm.train_pixels.host
    assert host is not None
    assert dm.train_pixels.pixels.data_ptr() == host.pixels.data_ptr()
    assert dm.train_pixels.nbytes == host.nbytes > 0


def test_sampler_state_of_two_ranks_resumes_on_one(make_ngp) -> None:
    """The sampler is global (all views) on every rank: a rank's state, checkpointed under 2 ranks,
    loads into one process that holds every view."""
    path = make_ngp(n=N_FRAMES, size=SIZE)
    two = _datamodule(path, sampler="loss_weighted")
    two.train_pixels.load(1, 2)  # rank 1 of 2
    assert two.train_set.pixels.shape[0] == (N_TRAIN // 2) * SIZE[0] * SIZE[1]
    two.ensure_device(torch.device("cpu"))
    batch = two.train_batch(256)
    two.sampler.update(batch.view_ids, batch.px, batch.py, batch.rgb.sum(1))
    for step in range(300):
        two.sampler.step(step)
    state = two.state_dict()
    one = _datamodule(path, sampler="loss_weighted")
    one.load_state_dict(state)
    assert torch.equal(one.sampler.view_probs, two.sampler.view_probs)
    assert not torch.allclose(one.sampler.view_probs, one.sampler._uniform_view_probs())
    assert one.train_set.pixels.shape[0] == N_TRAIN * SIZE[0] * SIZE[1]


def test_large_capture_is_written_once(tmp_path: Path) -> None:
    from nerf_lightning.data.synthetic import ensure_large_capture

    out = ensure_large_capture(tmp_path, n_views=10, width=24, height=16, workers=1)
    assert out.name.startswith("large-10x24x16-v")
    images = sorted((out / "images").glob("*.png"))
    assert len(images) == 10
    stamp = (out / "transforms.json").stat().st_mtime_ns
    assert ensure_large_capture(tmp_path, n_views=10, width=24, height=16, workers=1) == out
    assert (out / "transforms.json").stat().st_mtime_ns == stamp  # cached: not rendered again
    dm = _datamodule(out, test_every=5)
    assert dm.n_train_views == 8 and dm.train_set.pixels.shape[0] == 8 * 24 * 16


def test_large_capture_repeats_its_views_without_holding_out_a_training_view(tmp_path: Path) -> None:
    from nerf_lightning.data.synthetic import ensure_large_capture

    out = ensure_large_capture(tmp_path, n_views=8, width=16, height=12, workers=1, repeat=3)
    assert out.name.endswith("-x3") and not (out / "images").exists()  # the renders are not copied
    dm = _datamodule(out)  # test_every=8: frames 0, 8, 16 held out, all copies of view 0
    held_out = {f.image_path for f in dm.val_set.frames}
    assert len(dm.val_set.frames) == 3 and len(held_out) == 1
    assert dm.n_train_views == 21 and not held_out & {f.image_path for f in dm.train_set.frames}
    assert dm.train_set.pixels.shape[0] == 21 * 16 * 12
