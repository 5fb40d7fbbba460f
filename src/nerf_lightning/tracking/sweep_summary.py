"""The multirun summary: one row per job of a Hydra sweep (``-m``, Optuna), as a table and a CSV.

:class:`MultirunSummary` (a Hydra callback, ``hydra/default.yaml``): at the end of a sweep, a rich
table and ``<sweep dir>/summary.csv`` with every job's overrides and metrics.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Literal

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf

__all__ = ["MultirunSummary", "collect_sweep", "write_sweep_summary"]

log = logging.getLogger(__name__)


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

    def __init__(
        self, optimized_metric: str | None = None, direction: Literal["maximize", "minimize"] = "maximize"
    ) -> None:
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
