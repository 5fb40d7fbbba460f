"""A W&B logger that never blocks or crashes training.

- :class:`WandbLogger` (``logger=wandb``): Lightning's ``WandbLogger`` that decides its mode before
  ``wandb.init`` (:func:`~nerf_lightning.tracking.wandb_mode.resolve_wandb_mode`): **offline** when
  there is no API key (no ``WANDB_API_KEY`` / ``WANDB_IDENTITY_TOKEN_FILE``, no ``~/.netrc`` entry for
  the W&B host) or the host is unreachable, and offline again if an online ``wandb.init`` fails anyway.
  It then prints one line telling how to upload the run later (``wandb sync <dir>``). ``group: auto``
  puts every job of one Hydra multirun in one W&B group (the sweep folder's name); ``name: auto`` names
  a job by its overrides.
- :func:`finish_loggers`: writes the final metrics into the W&B run summary and closes the run, so
  the next job of a multirun (same process) starts a new run instead of reusing this one.
"""

from __future__ import annotations

import logging
import math
import secrets
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from nerf_lightning.tracking.wandb_mode import resolve_wandb_mode
from nerf_lightning.utils.io import atomic_write_bytes

__all__ = ["RUN_ID_FILE", "WandbLogger", "auto_group", "auto_name", "finish_loggers", "run_id_for"]

log = logging.getLogger(__name__)


def _hydra_runtime() -> DictConfig | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _in_multirun() -> bool:
    hc = _hydra_runtime()
    return bool(hc is not None and str(hc.mode) in ("RunMode.MULTIRUN", "MULTIRUN"))


def auto_group(task_name: str = "train") -> str:
    """One group per Hydra sweep (``<task>/<sweep folder>``); single runs share ``<task>``."""
    hc = _hydra_runtime()
    if hc is not None and _in_multirun():
        return f"{task_name}/{Path(str(hc.sweep.dir)).name}"
    return task_name


def auto_name() -> str | None:
    """A multirun job: ``<job num>:<overrides>`` (``0:model.net.field.encoding.log2_hashmap_size=15,...``);
    a single run: None (W&B picks a name; the overrides are in the logged config)."""
    hc = _hydra_runtime()
    if hc is None or not _in_multirun():
        return None
    name = str(hc.job.get("override_dirname") or "")
    return f"{hc.job.num}:{name}" if name else str(hc.job.num)


RUN_ID_FILE = "wandb_run_id"


def run_id_for(run_dir: Path) -> str:
    """The W&B run id of the training run in ``run_dir``: read from ``run_dir/wandb_run_id``, or made
    and written there (atomically) on the run's first start.

    A job restarted in the same folder (``ckpt_path=last``, ``resume=auto``, a SLURM requeue) thus logs
    into the same W&B run (``resume="allow"``) instead of starting a new one at step 0.
    """
    path = run_dir / RUN_ID_FILE
    if path.is_file():
        existing = path.read_text().strip()
        if existing:
            return existing
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if rank_zero_only.rank != 0:
        return new  # only rank 0 logs to W&B (and owns the file)
    atomic_write_bytes(path, (new + "\n").encode())
    return new


class WandbLogger(_LightningWandbLogger):
    """Lightning's ``WandbLogger`` that runs offline when it cannot go online, and never raises at init.

    Args:
        project / entity / group / tags / name: the W&B run's place. ``group="auto"`` and
            ``name="auto"``: see :func:`auto_group` / :func:`auto_name`.
        mode: ``auto | online | offline | disabled`` (see :func:`resolve_wandb_mode`).
        save_dir: parent of the ``wandb/`` folder (the Hydra run dir).
        log_model: ``False``, ``True`` (best/last checkpoints at the end) or ``"all"`` (each one) as
            W&B artifacts; offline they are stored in the run folder and uploaded by ``wandb sync``.
        init_timeout: seconds ``wandb.init`` may wait for the server before falling back to offline.
        network_timeout: seconds of the reachability check done before going online.
        task_name: used by ``group="auto"``.
        **kwargs: passed to ``wandb.init`` (``job_type``, ``notes``, ...).
    """

    def __init__(
        self,
        project: str = "nerf_lightning",
        entity: str | None = None,
        group: str | None = "auto",
        tags: Iterable[str] | None = None,
        name: str | None = "auto",
        mode: str = "auto",
        save_dir: str = ".",
        log_model: bool | str = False,
        init_timeout: float = 60.0,
        network_timeout: float = 2.0,
        task_name: str = "train",
        **kwargs: Any,
    ) -> None:
        resolved, self.mode_reason = resolve_wandb_mode(mode, network_timeout)
        self.mode = resolved
        self._init_timeout = float(init_timeout)
        self._announced = False
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        if "id" not in kwargs:  # an explicit id (and resume policy) wins
            kwargs["id"] = run_id_for(Path(save_dir))
            kwargs.setdefault("resume", "allow")
        super().__init__(
            name=auto_name() if name == "auto" else name,
            save_dir=save_dir,
            project=project,
            log_model=log_model,
            entity=entity,
            group=auto_group(task_name) if group == "auto" else group,
            tags=list(tags or []),
            mode=resolved,
            **kwargs,
        )
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)  # wandb >= 0.2x warns about the setting at all

    def _settings(self, mode: str) -> Any:
        import wandb

        # Offline: wandb's own banner and multi-line footer are replaced by our one sync line.
        return wandb.Settings(init_timeout=self._init_timeout, silent=mode != "online", quiet=True)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is not None:
            return self._experiment
        import wandb
        from lightning.fabric.loggers.logger import _DummyExperiment

        # Fallback chain: online -> offline -> disabled -> a dummy; each failure costs one warning.
        first = self._wandb_init["mode"]
        chain = [first] + (["offline"] if first == "online" else [])
        chain += [] if first == "disabled" else ["disabled"]
        for mode in chain:
            self._wandb_init["mode"] = mode
            self._wandb_init["settings"] = self._settings(mode)
            try:
                _LightningWandbLogger.experiment.fget(self)  # type: ignore[attr-defined]
            except Exception as err:  # noqa: BLE001 - tracking must never stop training
                self._experiment = None
                if wandb.run is not None:
                    wandb.finish(exit_code=1, quiet=True)
                log.warning("W&B %s init failed (%s: %s)", mode, type(err).__name__, err)
                self.mode_reason = f"wandb.init {mode} failed"
                continue
            if mode != first:
                log.warning("W&B continues %s", mode)
            self.mode = mode
            self._announce()
            return self._experiment
        self.mode = "disabled"
        self._experiment = _DummyExperiment()
        return self._experiment

    def _announce(self) -> None:
        """The one line a user needs: where the run is (online) or how to upload it (offline)."""
        if self._announced or self._experiment is None:
            return
        self._announced = True
        run = self._experiment
        if self.mode == "offline":
            sync_dir = Path(run.dir).parent  # <save_dir>/wandb/offline-run-<time>-<id>
            if not _in_multirun():  # a sweep prints one line for all its jobs (MultirunSummary)
                print(f"W&B offline ({self.mode_reason}): upload with `wandb sync {sync_dir}`", flush=True)
        elif self.mode == "online":
            print(f"W&B run: {getattr(run, 'url', None) or run.name}", flush=True)

    @property
    def offline_dir(self) -> Path | None:
        """The offline run folder (what ``wandb sync`` takes), once the run exists."""
        if self.mode != "offline" or self._experiment is None or not getattr(self._experiment, "dir", None):
            return None
        return Path(self._experiment.dir).parent


def _finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[k] = f
    return out


@rank_zero_only
def finish_loggers(
    loggers: Iterable[Logger], metrics: Mapping[str, Any] | None = None, exit_code: int = 0
) -> None:
    """Final metrics into each W&B run's summary, then close the run (never raises)."""
    for lg in loggers:
        if not isinstance(lg, _LightningWandbLogger) or lg._experiment is None:
            continue
        run = lg._experiment
        try:
            if metrics:
                run.summary.update(_finite(metrics))
            run.finish(exit_code=exit_code)
        except Exception as err:  # noqa: BLE001
            log.warning("W&B finish failed (%s: %s)", type(err).__name__, err)
        lg._experiment = None
