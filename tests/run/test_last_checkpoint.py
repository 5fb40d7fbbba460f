"""When ``LastCheckpoint`` writes ``last.ckpt``: every ``every_n_seconds`` of training (the clock read
every ``check_every_n_steps`` steps), or every ``every_n_train_steps`` steps instead, and at the end."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from nerf_lightning.run import checkpoint_callbacks
from nerf_lightning.run.checkpoint_callbacks import LastCheckpoint
from nerf_lightning.run.checkpoint_io import read_checkpoint

MAX_STEPS = 20


class _Clock:
    """A fake ``monotonic`` that stands still until moved (``_Tiny`` moves it one second per step)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Tiny(L.LightningModule):
    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.clock = clock

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.clock.now += 1.0
        return self.layer(batch).square().mean()

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(64, 2), batch_size=2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _written_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs) -> list[int]:
    clock = _Clock()
    monkeypatch.setattr(checkpoint_callbacks, "monotonic", clock)
    cb = LastCheckpoint(dirpath=str(tmp_path / "ckpt"), **kwargs)
    steps: list[int] = []
    save = cb._save_checkpoint

    def recording_save(trainer: L.Trainer, filepath: str) -> None:
        steps.append(trainer.global_step)
        save(trainer, filepath)

    monkeypatch.setattr(cb, "_save_checkpoint", recording_save)
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    trainer.fit(_Tiny(clock))
    assert int(read_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"]) == MAX_STEPS
    return steps


def test_every_n_seconds_reads_the_clock_every_n_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 s per step; the clock is read at even steps: 6 - 0 >= 6 at step 6, then 12, 18; the end at 20
    assert _written_steps(tmp_path, monkeypatch, every_n_seconds=6, check_every_n_steps=2) == [6, 12, 18, 20]
    # read every 4 steps: 8 (8 >= 5), 16 (16 - 8 >= 5), the end
    assert _written_steps(tmp_path, monkeypatch, every_n_seconds=5, check_every_n_steps=4) == [8, 16, 20]


def test_every_n_train_steps_replaces_the_time_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _written_steps(tmp_path, monkeypatch, every_n_seconds=1, every_n_train_steps=7) == [7, 14, 20]


def test_no_trigger_writes_only_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _written_steps(tmp_path, monkeypatch, every_n_seconds=None) == [20]


def test_bad_values_are_named() -> None:
    key = "callbacks.last_checkpoint"
    with pytest.raises(ValueError, match=rf"^{key}.every_n_seconds=-1: expected a number >= 0"):
        LastCheckpoint(dirpath="x", every_n_seconds=-1)
    with pytest.raises(ValueError, match=rf"^{key}.check_every_n_steps=0: expected an integer >= 1$"):
        LastCheckpoint(dirpath="x", check_every_n_steps=0)


def test_under_ddp_rank_zero_decides_at_the_checks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks' clocks differ: each rank broadcasts at the same steps and follows rank 0's answer."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    clock = _Clock()
    monkeypatch.setattr(checkpoint_callbacks, "monotonic", clock)
    cb = LastCheckpoint(dirpath="x", every_n_seconds=5, check_every_n_steps=4)
    calls: list[bool] = []
    rank0_says = [False]

    def broadcast(obj: bool) -> bool:
        calls.append(obj)
        return rank0_says[0]

    trainer = SimpleNamespace(
        global_step=0, world_size=2, fast_dev_run=False, sanity_checking=False,
        state=SimpleNamespace(fn=TrainerFn.FITTING), strategy=SimpleNamespace(broadcast=broadcast),
    )  # fmt: skip
    cb._last_write = clock.now
    clock.now += 100.0  # this rank's clock says a write is due
    trainer.global_step = 3
    assert not cb._time_is_due(trainer) and calls == []  # not a check step: no collective
    trainer.global_step = 4
    assert not cb._time_is_due(trainer) and calls == [True]  # rank 0 says no
    rank0_says[0] = True
    trainer.global_step = 8
    assert cb._time_is_due(trainer) and calls == [True, True]
