"""The train app's fit and final validation: :func:`fit_and_score`, and the one-line stops of a run that
a signal, a divergence or a lost peer rank ended (``docs/exit_codes.md``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from nerf_lightning.errors import Diverged, StopRun
from nerf_lightning.lightning_compat import last_saved_step, slurm_detection_off
from nerf_lightning.models.metrics import final_evaluation
from nerf_lightning.run.checkpoint_callbacks import LastCheckpoint
from nerf_lightning.run.hangup import interruption, stop_signal
from nerf_lightning.run.peer_loss import rank_lost
from nerf_lightning.run.strategies import unshard_fsdp_root

__all__ = ["Scores", "fit_and_score", "validate_trained"]


def _of_max(trainer: L.Trainer) -> str:
    return f" of {trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""


def _last_checkpoint_note(trainer: L.Trainer) -> str:
    """Which step ``last.ckpt`` holds after training stopped early (for the one-line message)."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, LastCheckpoint):
            path = Path(cb.dirpath or ".") / "last.ckpt"
            if path.is_file() and last_saved_step(cb) >= 0:
                return f"{path} holds step {last_saved_step(cb)}"
            return f"no {path} was written yet"
    return "no last.ckpt is written (callbacks.last_checkpoint is off)"


def validate_trained(trainer: L.Trainer, model: L.LightningModule, datamodule: Any) -> list[dict[str, float]]:
    """Validate the weights just trained. Under SLURM, ``validate(ckpt_path=None)`` would load the run's
    newest ``hpc_ckpt_<n>.ckpt`` (what a requeued job resumed from) instead: Lightning picks it whenever
    it detects SLURM, so detection is switched off for this call. Under FSDP the module first gets its
    full parameters back (``unshard_fsdp_root``)."""
    unshard_fsdp_root(trainer, model)
    with slurm_detection_off():
        return trainer.validate(model, datamodule=datamodule, verbose=False)


@dataclass(frozen=True)
class Scores:
    """What fitting and the final validation gave: the training's wall time, Lightning's validation
    results and the final evaluation's numbers."""

    wall_s: float
    results: list[dict[str, float]]
    evaluation: dict[str, Any]


def fit_and_score(
    trainer: L.Trainer, model: L.LightningModule, datamodule: Any, ckpt_path: str | None
) -> Scores | StopRun:
    """Fit, then validate the weights trained and run the final evaluation. A stop with one line of its
    own is returned, for the caller to raise once it has taken its exit status: a stop signal (training
    or the final validation), a divergence, a lost peer rank; other errors propagate."""
    start = time.perf_counter()
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        return interruption(
            f"training stopped by {stop_signal()} at step {trainer.global_step}{_of_max(trainer)}; "
            f"{_last_checkpoint_note(trainer)}: the same command plus ckpt_path=last (or resume=auto) "
            "continues it"
        )
    except Diverged as err:
        return Diverged(f"{err}; {_last_checkpoint_note(trainer)}")
    except RuntimeError as err:
        where = f"at step {trainer.global_step}{_of_max(trainer)}; {_last_checkpoint_note(trainer)}"
        if (lost := rank_lost(err, trainer.global_rank, trainer.world_size, where)) is None:
            raise
        return lost
    wall_s = time.perf_counter() - start
    try:
        results = validate_trained(trainer, model, datamodule)
        # per-view numbers, and the final evaluation on the test split when the capture has one
        evaluation = final_evaluation(trainer, model, datamodule)
    except SIGTERMException:
        return interruption(
            f"stopped by {stop_signal()} during the final validation, after {trainer.global_step} steps "
            f"of training; {_last_checkpoint_note(trainer)}: `python -m nerf_lightning.eval ckpt=...` "
            "scores it"
        )
    return Scores(wall_s, results, evaluation)
