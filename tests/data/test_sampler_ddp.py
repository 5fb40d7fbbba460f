"""Two-process gloo run: ranks feed different losses and draw with different seeds; after step()
they hold identical view probabilities (those of the pooled statistics) but draw different rays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runs import run_ranks

from nerf_lightning.data.sampler import LossWeightedRaySampler

WORLD = 2
KW = dict(
    widths=[8, 16, 8, 12],
    heights=[8, 8, 4, 12],
    warmup_steps=0,
    update_every=2,
    ema_decay=0.5,
)
# rank r: per-view loss table; the rays it feeds come from its own draws
LOSSES = [[4.0, 0.5, 0.5, 0.5], [0.25, 0.5, 0.5, 2.0]]
STEPS = 4
N_RAYS = 2048


def _rank_rays(rank: int, step: int) -> tuple[torch.Tensor, ...]:
    """What rank `rank` draws and feeds at `step` (reproducible in the parent for the reference)."""
    s = LossWeightedRaySampler(**KW)
    v, x, y = s.sample(N_RAYS, torch.Generator().manual_seed(1000 * rank + step))
    return v, x, y, torch.tensor(LOSSES[rank])[v]


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        s = LossWeightedRaySampler(**KW)
        for step in range(STEPS):
            v, x, y, loss = _rank_rays(rank, step)
            s.update(v, x, y, loss)
            s.step(step)
        rays = s.sample(N_RAYS, torch.Generator().manual_seed(rank))  # per-rank randomness
        torch.save(
            {"view_probs": s.view_probs, "cdf": s.cdf, "ema": s.ema, "rays": rays},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
        dist.barrier()  # neither rank tears its group down while the other may still use it
    finally:
        dist.destroy_process_group()


def test_ranks_hold_identical_weights_of_pooled_statistics(tmp_path: Path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    # fork: the children inherit the imported torch (a fresh import costs seconds per process); each
    # child uses one intra-op thread, the pattern DataLoader workers rely on after fork
    run_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD))

    assert torch.equal(r0["view_probs"], r1["view_probs"])
    assert torch.equal(r0["cdf"], r1["cdf"])
    assert not all(torch.equal(a, b) for a, b in zip(r0["rays"], r1["rays"], strict=True))

    # reference: one process that saw both ranks' rays gets the same weights (the all-reduce pooled them)
    ref = LossWeightedRaySampler(**KW)
    for step in range(STEPS):
        for rank in range(WORLD):
            ref.update(*_rank_rays(rank, step))
        ref.step(step)
    torch.testing.assert_close(r0["ema"], ref.ema, rtol=1e-6, atol=0)
    torch.testing.assert_close(r0["view_probs"], ref.view_probs, rtol=1e-6, atol=0)
    # and the pooled weights differ from what either rank alone would have computed
    alone = LossWeightedRaySampler(**KW)
    for step in range(STEPS):
        alone.update(*_rank_rays(0, step))
        alone.step(step)
    assert not torch.allclose(alone.view_probs, r0["view_probs"], rtol=1e-3)
