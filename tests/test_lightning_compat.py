"""Each workaround of nerf_lightning.lightning_compat against the installed Lightning: an upgrade that moves
one of the internals fails here, by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment

from nerf_lightning import lightning_compat as compat


class _Tiny(compat.FastHookNames, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.seen: dict[str, list[Any]] = {"fx": [], "logs": [], "in_flight": [], "batch_idx": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["fx"].append(self._current_fx_name)
        self.seen["logs"].append(compat.logs_this_step(self.trainer))
        return (self.w * batch[0]).square().sum()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen["in_flight"].append(compat.batch_in_flight(self.trainer))
        self.seen["batch_idx"].append((batch_idx, compat.epoch_batch_idx(self.trainer)))

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(32, 2)), batch_size=4)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(tmp_path: Path, max_steps: int, **kwargs: Any) -> L.Trainer:
    return L.Trainer(
        default_root_dir=tmp_path, max_steps=max_steps, accelerator="cpu", enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


def test_hook_names_still_reach_the_module_and_bypass_module_setattr(tmp_path: Path) -> None:
    model = _Tiny()
    _trainer(tmp_path, 3, logger=False, enable_checkpointing=False).fit(model)
    assert model.seen["fx"] == ["training_step"] * 3
    assert "_current_fx_name" in vars(model)  # set as a plain attribute, not through nn.Module


def test_logs_this_step_follows_log_every_n_steps(tmp_path: Path) -> None:
    model = _Tiny()
    logger = CSVLogger(tmp_path)
    _trainer(tmp_path, 7, logger=logger, log_every_n_steps=3, enable_checkpointing=False).fit(model)
    # Lightning writes on steps 3 and 6 (1-based): batches 2 and 5
    assert model.seen["logs"] == [False, False, True, False, False, True, False]
    assert compat.logs_this_step(None) is True


def test_set_max_steps_ends_the_running_fit(tmp_path: Path) -> None:
    class Shorter(_Tiny):
        def on_train_start(self) -> None:
            compat.set_max_steps(self.trainer, 4)

    model = Shorter()
    trainer = _trainer(tmp_path, 100, logger=False, enable_checkpointing=False)
    trainer.fit(model)
    assert trainer.global_step == 4 and len(model.seen["fx"]) == 4


def test_the_epoch_loop_position_is_readable_mid_batch(tmp_path: Path) -> None:
    model = _Tiny()
    _trainer(tmp_path, 3, logger=False, enable_checkpointing=False).fit(model)
    assert model.seen["in_flight"] == [True, True, True]
    assert model.seen["batch_idx"] == [(0, 0), (1, 1), (2, 2)]


def test_sigterm_broadcast_runs_only_every_n_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _trainer(tmp_path, 1, logger=False, enable_checkpointing=False)
    loop_type = type(trainer.fit_loop.epoch_loop)
    assert hasattr(loop_type, "_broadcast_sigterm_tensor")
    calls: list[int] = []
    monkeypatch.setattr(loop_type, "_broadcast_sigterm_tensor", lambda self: calls.append(1))
    compat.throttle_sigterm_broadcast(trainer, every_n_steps=4)
    steps = {"value": 0}
    monkeypatch.setattr(type(trainer), "global_step", property(lambda self: steps["value"]))
    for step in range(9):
        steps["value"] = step
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert len(calls) == 3  # steps 0, 4 and 8


def test_last_saved_step_and_forgetting_it(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    _trainer(tmp_path, 6, logger=False, callbacks=[checkpoint]).fit(_Tiny())
    assert compat.last_saved_step(checkpoint) == 6
    compat.forget_last_save(checkpoint)
    assert compat.last_saved_step(checkpoint) == -1


def test_slurm_detection_is_off_inside_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    assert SLURMEnvironment.detect()
    with compat.slurm_detection_off():
        assert not SLURMEnvironment.detect()
    assert SLURMEnvironment.detect()


def test_validation_by_time_is_told_from_validation_by_batches(tmp_path: Path) -> None:
    assert compat.validates_by_time(_trainer(tmp_path, 1, logger=False, val_check_interval={"minutes": 5}))
    assert not compat.validates_by_time(_trainer(tmp_path, 1, logger=False, val_check_interval=10))


class _Manual(_Tiny):
    """Manual optimization whose every other step is counted without ``LightningOptimizer.step`` (as a
    replayed CUDA graph is): the update by hand, then :func:`compat.count_optimizer_step`."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        loss = (self.w * batch[0]).square().sum()
        self.manual_backward(loss)
        if batch_idx % 2:
            with torch.no_grad():
                self.w -= 0.01 * self.w.grad
            self.w.grad = None
            compat.count_optimizer_step(optimizer)
        else:
            optimizer.step()
            optimizer.zero_grad()
        return loss


def test_a_step_counted_by_hand_advances_global_step(tmp_path: Path) -> None:
    model = _Manual()
    trainer = _trainer(tmp_path, 6, logger=False, enable_checkpointing=False)
    trainer.fit(model)
    assert trainer.global_step == 6  # 3 of LightningOptimizer.step, 3 counted
    assert trainer.fit_loop.epoch_loop.batch_idx == 5


def test_both_step_counts_are_set_to_the_larger(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 5, logger=False, enable_checkpointing=False)
    trainer.fit(_Tiny())  # automatic optimization: 5 steps
    loop = trainer.fit_loop.epoch_loop
    manual = loop.manual_optimization.optim_step_progress
    assert manual.total.completed == 0
    compat.align_step_counts(trainer)
    assert manual.total.completed == manual.total.ready == 5
    assert loop.automatic_optimization.optim_progress.optimizer_steps == 5
