"""``grad_exchange=bf16``: the DDP hook averages the ranks' gradients as the float32 all-reduce does, within
one bfloat16 rounding (two gloo processes, a real hash-grid field, the mean computed by hand)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runs import run_ranks
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from nerf_lightning.callbacks.grad_exchange import (
    GradientExchange,
    bf16_gradients,
    comm_hook,
    register,
)

CONF = Path(__file__).resolve().parents[2] / "src" / "nerf_lightning" / "conf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _field() -> torch.nn.Module:
    from nerf_lightning.models.field import NGPField

    torch.manual_seed(0)
    return NGPField(encoding=dict(n_levels=4, log2_hashmap_size=10, max_resolution=64),
                    hidden_dim=16, backend="torch")  # fmt: skip


def _rank_loss(field: torch.nn.Module, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.rand(512, 3, generator=g) * 0.8 + 0.1
    d = torch.nn.functional.normalize(torch.randn(512, 3, generator=g), dim=-1)
    sigma, rgb = field(x, d)
    return (sigma.square().mean() + rgb.square().mean()) * (1 + rank)


@contextmanager
def _gloo_rank(rank: int, port: int) -> Iterator[None]:
    """One of two gloo processes on this machine, its group torn down on the way out."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _worker(rank: int, port: int, out: str, exchange: str) -> None:
    with _gloo_rank(rank, port):
        ddp = torch.nn.parallel.DistributedDataParallel(_field())
        register(ddp, exchange)
        _rank_loss(ddp, rank).backward()
        grads = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
        torch.save(grads, Path(out) / f"{exchange}_rank{rank}.pt")
        # both ranks done before either tears down: the reducer and the process group go while the peer
        # is still there (a gloo group destroyed after its peer left can wait forever for its threads)
        dist.barrier()
        del ddp


def test_bf16_exchange_equals_the_mean_of_the_ranks_gradients(tmp_path: Path) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for exchange in ("fp32", "bf16"):
            run_ranks(_worker, (_free_port(), str(tmp_path), exchange))
    finally:
        torch.set_num_threads(threads)
    # the mean over the two ranks, computed here from each rank's own gradient
    own = []
    for rank in range(2):
        field = _field()
        _rank_loss(field, rank).backward()
        own.append({n: p.grad for n, p in field.named_parameters()})
    result = {e: [torch.load(tmp_path / f"{e}_rank{r}.pt") for r in range(2)] for e in ("fp32", "bf16")}
    for name, g0 in own[0].items():
        mean = (g0 + own[1][name]) / 2
        fp32, bf16 = result["fp32"][0][name], result["bf16"][0][name]
        assert torch.equal(bf16, result["bf16"][1][name]), name  # every rank gets the same gradient
        torch.testing.assert_close(fp32, mean, rtol=1e-5, atol=1e-9, msg=name)
        # each rank's half rounded to bfloat16 (8 significant bits), their sum rounded again
        scale = g0.abs().max() + own[1][name].abs().max()
        err = (bf16 - mean).abs().max()
        assert err <= 2.0**-8 * scale + 1e-30, f"{name}: {err} > 2^-8 x {scale}"
        if scale > 0:
            assert not torch.equal(bf16, fp32) or name.endswith("bias"), name  # it did round


class _TableFirst(torch.nn.Module):
    """A 2 MB "table" whose gradient is ready first, then a small "MLP": after its first pass DDP rebuilds
    its buckets in that order, and its first bucket of 1 MB closes after the table, so by default the two
    travel apart (as a graphed backward that hands the table's gradient over first makes them travel)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Parameter(torch.ones(1000))
        self.table = torch.nn.Parameter(torch.ones(2**19))

    def forward(self, rank: int) -> torch.Tensor:
        mlp = self.mlp.square().sum()
        table = self.table.square().sum()  # made last, so autograd hands its gradient over first
        return (table + mlp) * (1 + rank)


def _bucket_worker(rank: int, port: int, out: str, config: str) -> None:
    """Two backward passes under DDP built with the keyword arguments of the strategy group's ``ddp.yaml``
    (``config="ours"``) or DDP's defaults; the buckets each pass all-reduced (DDP may rebuild its buckets
    after the first)."""
    from omegaconf import OmegaConf

    with _gloo_rank(rank, port):
        strategy = OmegaConf.load(CONF / "strategy" / "ddp.yaml").strategy
        keys = ("find_unused_parameters", "gradient_as_bucket_view", "broadcast_buffers", "static_graph",
                "bucket_cap_mb")  # fmt: skip
        kwargs = {k: strategy[k] for k in keys if k in strategy} if config == "ours" else {}
        ddp = torch.nn.parallel.DistributedDataParallel(_TableFirst(), **kwargs)
        buckets: list[int] = []

        def counting(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations as objects
            buckets[-1] += 1
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting)
        for _ in range(2):
            buckets.append(0)
            ddp(rank).backward()
        torch.save(buckets, Path(out) / f"buckets_{config}_rank{rank}.pt")
        dist.barrier()
        del ddp


def test_the_strategy_config_exchanges_the_whole_gradient_in_one_bucket(tmp_path: Path) -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for config in ("ours", "defaults"):
            run_ranks(_bucket_worker, (_free_port(), str(tmp_path), config))
    finally:
        torch.set_num_threads(threads)
    for rank in range(2):
        assert torch.load(tmp_path / f"buckets_ours_rank{rank}.pt") == [1, 1]
        assert torch.load(tmp_path / f"buckets_defaults_rank{rank}.pt")[1] == 2  # what bucket_cap_mb changes


def test_exchange_names() -> None:
    assert comm_hook("fp32") is None and comm_hook("bf16") is bf16_gradients
    with pytest.raises(ValueError, match="grad_exchange must be one of"):
        GradientExchange("fp16")
