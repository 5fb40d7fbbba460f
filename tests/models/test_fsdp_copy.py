"""``utils.distributed.fsdp_full_copy`` under a real FSDP wrapping (two CPU processes, gloo).

Lightning's FSDP strategy needs GPUs, torch's FSDP does not: the field is wrapped the way
``strategy=fsdp`` wraps it (one unit per hash encoding, ``use_orig_params``), each rank holds half of
every parameter, and the copy that evaluation renders with must equal the unsharded field exactly.
"""

from __future__ import annotations

import copy
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nerf_lightning.models.encoding import HashEncoding
from nerf_lightning.models.field import NGPField
from nerf_lightning.run.strategies import fsdp_full_copy, fsdp_wrap_policy

ENCODING = {
    "n_levels": 4,
    "n_features_per_level": 2,
    "log2_hashmap_size": 10,
    "base_resolution": 4,
    "max_resolution": 32,
}


class _Holder(torch.nn.Module):
    """Stands in for the LightningModule: the FSDP root, with the field as a child."""

    def __init__(self) -> None:
        super().__init__()
        self.field = NGPField(aabb_scale=1, encoding=ENCODING, backend="torch")


class _Trainer:
    def __init__(self, strategy: object) -> None:
        self.strategy = strategy


def _rank(rank: int, world: int, port: int) -> None:
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    # forked from a test process whose OpenMP pool has run: a forked child must not use that pool
    # (it hangs in the first parallel op otherwise)
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same initial field on every rank, as after Lightning's seeding
        holder = _Holder()
        with torch.no_grad():
            for p in holder.parameters():  # values far from the init, so a fresh field cannot pass
                p.uniform_(-0.5, 0.5)
        reference = copy.deepcopy(holder.field)
        wrapped = FullyShardedDataParallel(
            holder, auto_wrap_policy=fsdp_wrap_policy(), use_orig_params=True, device_id=torch.device("cpu")
        )
        shapes = {n: tuple(p.shape) for n, p in holder.field.named_parameters()}
        assert shapes["encoding._fsdp_wrapped_module.params"] != tuple(reference.encoding.params.shape)

        strategy = FSDPStrategy()
        strategy.model = wrapped

        def factory() -> NGPField:
            return NGPField(aabb_scale=1, encoding=ENCODING, backend="torch")

        full = fsdp_full_copy(_Trainer(strategy), holder.field, factory)
        assert full is not None and not full.training
        assert not any(isinstance(m, FullyShardedDataParallel) for m in full.modules())
        assert isinstance(full.encoding, HashEncoding)
        want = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
        got = {**dict(full.named_parameters()), **dict(full.named_buffers())}
        assert got.keys() == want.keys()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)
        x = torch.rand(64, 3, generator=torch.Generator().manual_seed(1))
        d = torch.nn.functional.normalize(
            torch.randn(64, 3, generator=torch.Generator().manual_seed(2)), dim=-1
        )
        with torch.no_grad():
            for a, b in zip(full(x, d), reference(x, d), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        # the live field is untouched: still sharded after the copy
        assert {n: tuple(p.shape) for n, p in holder.field.named_parameters()} == shapes
        # what `strategy=fsdp` checkpoints (state_dict_type: full) hold is the plain module's state
        # dict, so eval/render/export load it under strategy=single
        with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT):
            saved = wrapped.state_dict()
        plain = _Holder()
        plain.load_state_dict(saved, strict=True)
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(plain.field.state_dict()[name], value, rtol=0, atol=0, msg=name)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_full_copy_and_full_state_dict_equal_the_unsharded_field_on_every_rank() -> None:
    ranks = mp.start_processes(_rank, args=(2, _free_port()), nprocs=2, start_method="fork", join=False)
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=2):  # raises what a rank raised
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            pytest.fail("the two FSDP ranks did not finish within 120 s")


def test_no_copy_outside_fsdp() -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    built = []
    trainer = _Trainer(SingleDeviceStrategy(device=torch.device("cpu")))
    field = NGPField(aabb_scale=1, encoding=ENCODING, backend="torch")
    assert fsdp_full_copy(trainer, field, lambda: built.append(1) or field) is None
    assert built == []  # nothing built, nothing gathered: evaluation renders with the field itself
