"""The run folder an app writes into: one it can write, and never an earlier training run to replace.

:class:`RunFolderGuard` is a Hydra callback (``conf/hydra/default.yaml``) of every app. It runs when
Hydra has composed the config and *before* it creates the run folder or writes anything into it
(``.hydra/``, the log file), so a refusal leaves the folder exactly as it was:

- **writable**: the run folder (a multirun's sweep folder) is created and a temporary file written
  into it. A read-only file system, a folder without write permission or a path through a file ends
  the command with one line, ``error: <folder>: <cause>``, and exit status 2, instead of the traceback
  Hydra would print when it fails to write its own files.
- **one command at a time** (every app: train, eval, render, export, view, process): the job's rank-0
  process claims the folder with an exclusive lock held for the command's life (``run/folder_lock.py``)
  *before* it looks for an earlier run there, so two commands started at the same moment cannot both
  find it empty: the second ends with
  ``error: <folder>: another run is writing into this folder (pid ..., started ...)`` and exit
  status 2, and leaves the folder as it was. A folder whose run died (lock released by the kernel) is
  claimed again; the log says it was left by a run that did not finish.
- **a training run's folder is training's** (every app but train): a folder that holds a training run
  (:func:`training_run_files`) is refused with one line that suggests a folder of the app's own (e.g.
  ``hydra.run.dir=<run>/eval``): the app would replace the run's ``.hydra/`` (what ``resume=auto``
  recognises the run by) and, for eval, its ``metrics.json``. An earlier eval's or render's folder is
  written again as before.
- **no silent overwrite** (the train app: its config has ``overwrite``): a folder that already holds a
  training run — ``checkpoints/*.ckpt``, ``hpc_ckpt_*.ckpt`` or ``metrics.json`` — is continued with
  ``ckpt_path=last`` / ``resume=auto`` (or from a given ``ckpt_path``), replaced with
  ``overwrite=true``, or refused. The folder is fixed by ``hydra.run.dir=...`` (or a launcher's job id:
  ``slurm-<id>``, ``NERF_LIGHTNING_RUN_ID``; a multirun's fixed ``hydra.sweep.dir``); Hydra's own
  timestamped folders are new. A SLURM job whose folder holds Lightning's ``hpc_ckpt_<n>.ckpt``
  resumes it by itself (Lightning's requeue path) and is let through.
- **nothing written before the app's checks** (``run/folder_commit.py``): as each job starts, what Hydra
  would write (``.hydra/``, the log) is held until the app commits; a job that ends without committing
  in a folder that held files gives back the lock as it found it (:func:`end_job`).

``overwrite=true`` deletes the old run's checkpoints, ``metrics.json`` and CSV log (its
``csv/metrics.csv``, which would otherwise be continued) once the train app's checks have passed
(:func:`delete_old_run`, on rank 0 only); other files (validation images, logs) stay.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.errors import UserError, user_errors
from nerf_lightning.run.folder_commit import end_run_folder, hold_run_folder
from nerf_lightning.run.folder_lock import LOCK_NAME, abandon_folder, claim_folder, describe, release_folder
from nerf_lightning.run.path_limits import check_path_length
from nerf_lightning.run.run_dir import rank_tag

__all__ = [
    "RunFolderGuard",
    "check_writable",
    "delete_old_run",
    "end_job",
    "refuse_overwrite",
    "refuse_training_run",
    "run_files",
    "training_run_files",
]

#: what a training run leaves in its folder that a new run into it would replace
RUN_FILES = ("checkpoints/*.ckpt", "hpc_ckpt_*.ckpt", "metrics.json")
#: what ``overwrite=true`` deletes: the run files and the CSV log a new run would continue
OVERWRITTEN = (*RUN_FILES, "csv/metrics.csv")


def run_files(folder: Path, patterns: Sequence[str] = RUN_FILES) -> list[Path]:
    """The files of an earlier training run in ``folder`` (sorted; empty when there is none)."""
    return sorted(p for pattern in patterns for p in Path(folder).glob(pattern) if p.is_file())


def check_writable(folder: Path) -> None:
    """Create ``folder`` and write a temporary file into it; :class:`UserError` naming the cause if not."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        cause = (err.strerror or str(err)).lower()
        raise UserError(
            f"{folder}: cannot write the run folder ({cause}); choose another with hydra.run.dir=..."
        ) from err


def refuse_overwrite(folder: Path, cfg: DictConfig, left_by: dict | None = None) -> None:
    """:class:`UserError` when ``folder`` holds a training run that ``cfg`` would silently replace.

    ``left_by``: the lock record of a run that died in this folder (named in the message)."""
    if cfg.get("overwrite") or cfg.get("ckpt_path") not in (None, "", "null"):
        return
    if str(cfg.get("resume") or "never") == "auto":
        return
    found = run_files(folder)
    if not found:
        return
    if _slurm_resumes(folder):
        return
    shown = ", ".join(str(p.relative_to(folder)) for p in found[:3]) + (", ..." if len(found) > 3 else "")
    died = f", left by a run that did not finish ({describe(left_by)})" if left_by else ""
    raise UserError(
        f"{folder}: already holds a training run ({shown}){died}; continue it with ckpt_path=last (or "
        "resume=auto), replace it with overwrite=true, or choose another hydra.run.dir"
    )


def training_run_files(folder: Path) -> list[Path]:
    """The files of a training run in ``folder``: :data:`RUN_FILES`, where a ``metrics.json`` that the
    eval app wrote (it records the ``checkpoint`` and ``split`` it scored) does not count."""
    return [p for p in run_files(folder) if not (p.name == "metrics.json" and _written_by_eval(p))]


def _written_by_eval(metrics: Path) -> bool:
    try:
        doc = json.loads(metrics.read_text())
    except (OSError, ValueError):  # unreadable: it may be a training's, so it counts as one
        return False
    return isinstance(doc, dict) and "checkpoint" in doc and "split" in doc


def refuse_training_run(folder: Path, app: str) -> None:
    """:class:`UserError` when ``folder`` holds a training run: no app but train writes into one."""
    found = training_run_files(folder)
    if not found:
        return
    shown = ", ".join(str(p.relative_to(folder)) for p in found[:3]) + (", ..." if len(found) > 3 else "")
    raise UserError(
        f"{folder}: holds a training run ({shown}); {app} writes only into a folder of its own, never "
        f"over a run's record (.hydra/, metrics.json): choose a fresh hydra.run.dir, e.g. "
        f"hydra.run.dir={folder / app}"
    )


def _slurm_resumes(folder: Path) -> bool:
    """Whether Lightning resumes this folder's ``hpc_ckpt_<n>.ckpt`` by itself (a requeued SLURM job)."""
    if not list(folder.glob("hpc_ckpt_*.ckpt")):
        return False
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect()


def delete_old_run(folder: Path) -> None:
    """``overwrite=true``: delete the earlier run's files that the new run would mix with its own."""
    for path in run_files(folder, OVERWRITTEN):
        path.unlink(missing_ok=True)


def end_job() -> None:
    """The end of an app's job, however it ended (``apps/entry.py``): the run folder keeps this command's
    record, and its lock is released, or, when the command wrote nothing into a folder that held files,
    the lock file is left as the claim found it."""
    ended = end_run_folder()
    if ended is None:
        return
    folder, kept = ended
    (release_folder if kept else abandon_folder)(folder)


def _is_train(config: DictConfig) -> bool:
    return "overwrite" in config


def _app(config: DictConfig) -> str:
    return str(OmegaConf.select(config, "hydra.job.config_name") or "this app")


def _claims() -> bool:
    """Whether this process claims the run folder: the job's rank-0 (or launching) process, of any app."""
    return rank_tag() is None


class RunFolderGuard(Callback):
    """Hydra callback: the checks of the module docstring, before Hydra writes into the run folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with user_errors():
            folder = Path(str(OmegaConf.select(config, "hydra.run.dir")))
            check_path_length(folder, "hydra.run.dir")
            train = _is_train(config)
            # a plain refusal leaves the folder exactly as it was
            if not train:
                refuse_training_run(folder, _app(config))
            elif not (folder / LOCK_NAME).exists():
                refuse_overwrite(folder, config)
            check_writable(folder)
            if _claims():
                # claimed, then checked: a run that started at the same moment is either refused by the
                # claim or has not written yet; a folder whose run died names it
                lock = claim_folder(folder)
                try:
                    if train:
                        refuse_overwrite(folder, config, lock.previous if lock else None)
                    else:
                        refuse_training_run(folder, _app(config))
                except UserError:
                    abandon_folder(folder)
                    raise

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_folder(Path(str(OmegaConf.select(config, "hydra.run.dir"))))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        with user_errors():
            sweep = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
            check_path_length(sweep, "hydra.sweep.dir")
            existed = sweep.is_dir()
            check_writable(sweep)
            if _claims():
                claim_folder(sweep)  # one sweep at a time in a sweep folder
            if _is_train(config) and existed:
                for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
                    refuse_overwrite(job, config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_folder(Path(str(OmegaConf.select(config, "hydra.sweep.dir"))))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hold_run_folder(config)
