"""Atomic writes: a save that fails or is killed half-way leaves the previous file whole and loadable.

The interruptions are real ones, in forked children (torch is already imported there): the file-size
limit (``RLIMIT_FSIZE``) makes the OS refuse the write part-way through the data, and ``SIGKILL``
stops a checkpoint save while it is still serializing. The children run no tensor kernels (their
checkpoints are built by the parent; one intra-op thread): OpenMP is not fork-safe.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import stat
from pathlib import Path

import pytest
import torch

from nerf_lightning.run.checkpoint_io import AtomicCheckpointIO
from nerf_lightning.utils.io import atomic_write_bytes, atomic_write_json

FORK = mp.get_context("fork")
OLD = {"state_dict": {"w": torch.arange(16.0)}, "global_step": 7}


def _write_old_checkpoint(path: Path) -> bytes:
    AtomicCheckpointIO().save_checkpoint(OLD, path)
    return path.read_bytes()


def _assert_old_checkpoint(path: Path, old_bytes: bytes) -> None:
    assert path.read_bytes() == old_bytes
    ckpt = AtomicCheckpointIO().load_checkpoint(path)
    assert ckpt["global_step"] == 7 and torch.equal(ckpt["state_dict"]["w"], torch.arange(16.0))
    # no half-written file is left next to it
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def _save_under_file_size_limit(checkpoint: dict, path: str, limit: int) -> None:
    torch.set_num_threads(1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    except Exception:  # noqa: BLE001 - any error will do, as long as the caller hears of it
        os._exit(3)
    os._exit(0)


def test_save_failing_mid_write_keeps_old_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    old = _write_old_checkpoint(path)
    big = {"state_dict": {"w": torch.zeros(1 << 18)}, "global_step": 8}  # 1 MiB of tensor data
    child = FORK.Process(target=_save_under_file_size_limit, args=(big, str(path), 256 * 1024))
    child.start()
    child.join(30)
    assert child.exitcode == 3, "the failed write must raise in the saving process, not pass silently"
    _assert_old_checkpoint(path, old)


class _BlockWhenPickled:
    """Stops the saving process inside ``torch.save`` (while the checkpoint is being serialized)."""

    def __init__(self, ready) -> None:
        self.ready = ready

    def __reduce__(self):
        self.ready.set()
        signal.pause()  # until SIGKILL
        raise AssertionError("unreachable")


def _save_blocking(checkpoint: dict, path: str) -> None:
    torch.set_num_threads(1)
    AtomicCheckpointIO().save_checkpoint(checkpoint, path)
    os._exit(0)


def test_save_killed_mid_way_keeps_old_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    old = _write_old_checkpoint(path)
    ready = FORK.Event()
    checkpoint = {
        "state_dict": {"w": torch.ones(1 << 16)},
        "global_step": 8,
        "callbacks": _BlockWhenPickled(ready),
    }
    child = FORK.Process(target=_save_blocking, args=(checkpoint, str(path)))
    child.start()
    try:
        assert ready.wait(30), "the child never reached the save"
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == -signal.SIGKILL
    assert path.read_bytes() == old and AtomicCheckpointIO().load_checkpoint(path)["global_step"] == 7


def test_failed_json_write_keeps_old_file_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.json"
    atomic_write_json(path, {"val/psnr": 30.0})
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", fail)
    monkeypatch.setattr(os, "rename", fail)
    with pytest.raises(OSError, match="simulated crash"):
        atomic_write_json(path, {"val/psnr": 31.0})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_writes_round_trip_with_ordinary_permissions(tmp_path: Path) -> None:
    """A checkpoint written atomically reads back and has the mode any new file gets (umask), not 0600."""
    path = tmp_path / "sub" / "last.ckpt"
    ckpt = {"state_dict": {"w": torch.randn(5, 3)}, "global_step": 3, "epoch": 1}
    AtomicCheckpointIO().save_checkpoint(ckpt, path)
    back = AtomicCheckpointIO().load_checkpoint(path)
    assert back["global_step"] == 3 and torch.equal(back["state_dict"]["w"], ckpt["state_dict"]["w"])
    atomic_write_bytes(tmp_path / "plain.bin", b"\x00\x01")
    (tmp_path / "reference.bin").write_bytes(b"")
    expected_mode = stat.S_IMODE((tmp_path / "reference.bin").stat().st_mode)
    for p in (path, tmp_path / "plain.bin"):
        assert stat.S_IMODE(p.stat().st_mode) == expected_mode, oct(p.stat().st_mode)


def test_a_checkpoint_of_non_finite_weights_is_never_written(tmp_path: Path) -> None:
    """The last line of defence: Lightning calls no callback's ``on_save_checkpoint`` for a weights-only
    checkpoint, so the divergence guard never sees it; the writer itself refuses NaN/inf weights."""
    from nerf_lightning.errors import Diverged

    path = tmp_path / "last.ckpt"
    old = _write_old_checkpoint(path)
    bad = {"state_dict": {"w": torch.tensor([1.0, float("nan")]), "b": torch.ones(2), "n": torch.tensor([3])}}
    with pytest.raises(Diverged, match=rf"NaN/inf in w at step 30 \({path} was not written\); lower the"):
        AtomicCheckpointIO().save_checkpoint({**bad, "global_step": 30}, path)
    _assert_old_checkpoint(path, old)
    inf = {"state_dict": {"a": torch.tensor([float("inf")]), "b": torch.tensor([-float("inf")])}}
    with pytest.raises(Diverged, match=r"NaN/inf in a, b at step \?"):
        AtomicCheckpointIO().save_checkpoint(inf, tmp_path / "new.ckpt")
    assert not (tmp_path / "new.ckpt").exists()
