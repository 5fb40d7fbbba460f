"""Experiment tracking: a W&B logger that never blocks or crashes training, and the multirun summary.

- :class:`WandbLogger` (``logger=wandb``): Lightning's ``WandbLogger`` that decides its mode before
  ``wandb.init``: **offline** when there is no API key (no ``WANDB_API_KEY`` /
  ``WANDB_IDENTITY_TOKEN_FILE``, no ``~/.netrc`` entry for the W&B host) or the host is unreachable,
  and offline again if an online ``wandb.init`` fails anyway. It then prints one line telling how to
  upload the run later (``wandb sync <dir>``). ``group: auto`` puts every job of one Hydra multirun
  in one W&B group (the sweep folder's name); ``name: auto`` names a job by its overrides.
- :func:`finish_loggers`: writes the final metrics into the W&B run summary and closes the run, so
  the next job of a multirun (same process) starts a new run instead of reusing this one.
- :class:`MultirunSummary` (a Hydra callback, ``hydra/default.yaml``): at the end of ``-m`` / Optuna
  sweeps, a rich table and ``<sweep dir>/summary.csv`` with every job's overrides and metrics.
- :func:`read_offline_run`: reads an offline run's ``.wandb`` file back (config, history, summary).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import netrc
import os
import secrets
import socket
import string
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hydra.experimental.callback import Callback as HydraCallback
from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers import Logger
from lightning.pytorch.loggers import TensorBoardLogger as _LightningTensorBoardLogger
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _LightningCSVWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.utils.io import atomic_write_bytes

log = logging.getLogger(__name__)

DEFAULT_WANDB_HOST = "https://api.wandb.ai"


# ------------------------------------------------------------------------------------ W&B mode
def wandb_host() -> str:
    """Host name of the W&B server (``WANDB_BASE_URL``, default api.wandb.ai)."""
    url = os.environ.get("WANDB_BASE_URL") or DEFAULT_WANDB_HOST
    return urlparse(url if "://" in url else f"https://{url}").hostname or "api.wandb.ai"


def wandb_has_credentials(host: str | None = None) -> bool:
    """Whether W&B could authenticate without a prompt: an API key in the environment or in netrc."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = host or wandb_host()
    candidates = [os.environ["NETRC"]] if os.environ.get("NETRC") else []
    home = Path(os.path.expanduser("~"))
    candidates += [str(home / ".netrc"), str(home / "_netrc")]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            continue  # an unreadable netrc is "no key", never an error
        if entry and entry[2]:
            return True
    return False


def wandb_reachable(host: str | None = None, timeout_s: float = 2.0) -> bool:
    """One TCP connect to the W&B host on 443, bounded by ``timeout_s`` (no HTTP, no auth)."""
    try:
        with socket.create_connection((host or wandb_host(), 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_wandb_mode(mode: str = "auto", timeout_s: float = 2.0) -> tuple[str, str]:
    """The mode ``wandb.init`` should run in, and why.

    Args:
        mode: ``auto`` (online when possible), ``online``, ``offline`` or ``disabled``. An explicit
            ``WANDB_MODE`` environment variable wins over ``auto``. ``online`` without credentials
            or network still falls back to offline: tracking must not stop training.
    Returns:
        ``(mode, reason)`` with mode in ``online | offline | disabled``.
    """
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode == "auto" and env_mode:
        mode = {"dryrun": "offline", "run": "online"}.get(env_mode, env_mode)
    if mode not in ("auto", "online", "offline", "disabled"):
        raise ValueError(f"logger.wandb.mode must be auto | online | offline | disabled, got {mode!r}")
    if mode in ("offline", "disabled"):
        return mode, "requested" if env_mode != mode else "WANDB_MODE"
    host = wandb_host()
    if not wandb_has_credentials(host):
        return "offline", "no W&B API key"
    if not wandb_reachable(host, timeout_s):
        return "offline", f"{host} unreachable"
    return "online", "API key found"


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
    """A multirun job: ``<job num>:<overrides>`` (``0:model.field.encoding.log2_hashmap_size=15,...``);
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


# ------------------------------------------------------------------------- offline run reader
_BLOCK = 32 * 1024
_HEADER = 7  # ":W&B" + magic 0xBEE1 (LE) + version; records: crc32 (4) + length (2, LE) + type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _iter_record_bytes(path: Path) -> Iterator[bytes]:
    """Payloads of a ``.wandb`` file (LevelDB log format: 32 KiB blocks, records split across them)."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (bad header {data[:4]!r})")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0 and length == 0:
            pos += left  # zero padding to the next block
            continue
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
            pending = b""


def read_offline_run(run_dir: str | Path) -> dict[str, Any]:
    """Read back an offline W&B run folder (``.../wandb/offline-run-*``).

    Returns:
        ``{"config": {key: value}, "history": [{key: value, ...} per wandb.log], "summary": {key: value},
        "group": str, "tags": [str], "name": str}``; values decoded from JSON.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("*.wandb"))
    if not files:
        raise FileNotFoundError(f"no .wandb file in {run_dir}")
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "group": "", "tags": [], "name": ""}
    for payload in _iter_record_bytes(files[0]):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            # A run can be recorded again later (updates) with fields left empty: keep what was set.
            out["group"] = rec.run.run_group or out["group"]
            out["name"] = rec.run.display_name or out["name"]
            out["tags"] = list(rec.run.tags) or out["tags"]
            for item in rec.run.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            out["history"].append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
    # Offline runs may carry no summary record: the last logged value of each key is W&B's summary.
    last: dict[str, Any] = {}
    for row in out["history"]:
        last.update(row)
    out["summary"] = {**last, **out["summary"]}
    return out


# --------------------------------------------------------------------------- multirun summary
def collect_sweep(sweep_dir: str | Path, optimized_metric: str | None = None) -> list[dict[str, Any]]:
    """One row per job folder under ``sweep_dir``: ``job``, ``dir``, ``status``, ``overrides`` and metrics."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for overrides_file in sorted(sweep_dir.glob("*/.hydra/overrides.yaml")):
        job_dir = overrides_file.parent.parent
        overrides = [str(o) for o in (OmegaConf.load(overrides_file) or [])]
        row: dict[str, Any] = {"job": job_dir.name, "dir": str(job_dir), "overrides": overrides}
        metrics_file = job_dir / "metrics.json"
        if metrics_file.is_file():
            row["status"] = "ok"
            row.update(json.loads(metrics_file.read_text()))
        else:
            row["status"] = "failed"
        rows.append(row)
    rows.sort(key=lambda r: (0, int(r["job"])) if r["job"].isdigit() else (1, r["job"]))
    return rows


def _varying_overrides(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Each job's overrides minus those every job shares (what the sweep changed)."""
    if not rows:
        return []
    common = set(rows[0]["overrides"]).intersection(*(set(r["overrides"]) for r in rows[1:]))
    if len(rows) == 1:
        common = set()
    return [[o for o in r["overrides"] if o not in common] for r in rows]


def write_sweep_summary(
    sweep_dir: str | Path,
    optimized_metric: str | None = "val/psnr",
    direction: str = "maximize",
    print_table: bool = True,
) -> Path | None:
    """Write ``<sweep_dir>/summary.csv`` and print the rich table; returns the CSV path (None: no jobs)."""
    from rich.console import Console
    from rich.table import Table

    sweep_dir = Path(sweep_dir)
    rows = collect_sweep(sweep_dir, optimized_metric)
    if not rows:
        return None
    varying = _varying_overrides(rows)
    # one column per scalar metric; nested entries (per-view tables) stay in each job's metrics.json
    metric_keys = sorted(
        {
            k
            for r in rows
            for k, v in r.items()
            if k not in ("job", "dir", "status", "overrides") and not isinstance(v, (dict, list))
        }
    )
    if optimized_metric in metric_keys:
        metric_keys.remove(optimized_metric)
        metric_keys.insert(0, optimized_metric)
    csv_path = sweep_dir / "summary.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["job", "status", "overrides", "sweep_overrides", *metric_keys, "dir"])
        for r, v in zip(rows, varying, strict=True):
            writer.writerow(
                [
                    r["job"],
                    r["status"],
                    " ".join(r["overrides"]),
                    " ".join(v),
                    *[r.get(k, "") for k in metric_keys],
                    r["dir"],
                ]
            )

    scored = [r for r in rows if isinstance(r.get(optimized_metric), (int, float))]
    best = None
    if scored:
        pick = max if direction == "maximize" else min
        best = pick(scored, key=lambda r: r[optimized_metric])
    if print_table:
        shown = [
            k
            for k in (
                optimized_metric,
                "val/ssim",
                "train/samples_per_s",
                "train/rays_per_s",
                "perf/step_time_ms",
                "time/train_s",
            )
            if k in metric_keys
        ]
        table = Table(title=f"sweep {sweep_dir}", title_justify="left")
        table.add_column("job", justify="right")
        table.add_column("overrides", overflow="fold")
        for k in shown:
            table.add_column(k, justify="right")
        for r, v in zip(rows, varying, strict=True):
            cells = [_fmt(r.get(k)) for k in shown] if r["status"] == "ok" else ["failed"] * len(shown)
            style = "bold green" if r is best else None
            table.add_row(r["job"], " ".join(v) or "-", *cells, style=style)
        console = Console()
        if not console.is_terminal:  # logs and pipes: no 80-column squeeze
            console = Console(width=160)
        console.print(table)
        console.print(f"summary: {csv_path}")
        offline = sorted(sweep_dir.glob("*/wandb/offline-run-*"))
        if offline:
            pattern = sweep_dir / "*" / "wandb" / "offline-run-*"
            console.print(
                f"W&B offline: upload the {len(offline)} runs with `wandb sync {pattern}`",
                highlight=False,
                soft_wrap=True,
            )
    return csv_path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"
    return "" if value is None else str(value)


class MultirunSummary(HydraCallback):
    """Hydra callback: after a multirun (``-m`` or a sweeper), the summary table and ``summary.csv``.

    Reads every job's ``.hydra/overrides.yaml`` and ``metrics.json`` from the sweep folder, so it works
    with any launcher (jobs in other processes) and marks jobs without metrics as failed.
    """

    def __init__(self, optimized_metric: str | None = None, direction: str = "maximize") -> None:
        self.optimized_metric = optimized_metric
        self.direction = direction
        self._sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = Path(str(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self._sweep_dir or Path(str(config.hydra.sweep.dir))
        metric = self.optimized_metric or config.get("optimized_metric") or "val/psnr"
        direction = self.direction
        sweeper_dir = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
        if isinstance(sweeper_dir, str) and sweeper_dir in ("minimize", "maximize"):
            direction = sweeper_dir
        try:
            write_sweep_summary(sweep_dir, metric, direction)
        except Exception as err:  # noqa: BLE001 - a summary must not turn a finished sweep into a failure
            log.warning("multirun summary failed (%s: %s)", type(err).__name__, err)


class _AppendingCSVWriter(_LightningCSVWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` (a resumed run's folder) is
    continued instead of deleted: its header is taken over and new rows are appended."""

    def _check_log_dir_exists(self) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            header = next(csv.reader(f), [])
        self.metrics_keys = sorted(header)


class CSVLogger(_LightningCSVLogger):
    """Lightning's ``CSVLogger`` (``logger=csv``) whose ``metrics.csv`` survives a resume in the same
    folder (``ckpt_path=last`` / ``resume=auto``): rows of the earlier process stay, new rows follow (the
    steps between the checkpoint and the crash appear twice, the later rows being the resumed run's)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _LightningCSVWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = _AppendingCSVWriter(log_dir=self.log_dir)
        return self._experiment


class TensorBoardLogger(_LightningTensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` plus ``log_image`` (the validation panels), like W&B's logger."""

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Log HxWx3 uint8/float images (numpy arrays or tensors) under ``key`` (``key/i`` when several)."""
        import numpy as np

        for i, image in enumerate(images):
            array = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
            tag = key if len(images) == 1 else f"{key}/{i}"
            self.experiment.add_image(tag, array, global_step=step, dataformats="HWC")
