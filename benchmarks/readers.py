"""How the benchmark runner reads a finished job's results: (run folder, log) -> rows.

A row is a flat dict with any of the keys of the results table (:data:`COLUMNS` of
:mod:`benchmarks.suite`): ``psnr`` [dB], ``psnr_ngp`` [dB] (instant-ngp's run.py metric), ``ssim``,
``steps``, ``train_s``, ``steps_per_s``,
``rays_per_s``, ``samples_per_s``, ``gpu_util`` [%], ``mem_gb``, ``note``, plus ``part`` (a suffix of the
job's name when one job gives several rows: a curve's checkpoints, an op benchmark's cases) and anything
else worth keeping in ``rows.jsonl``. A reader raises ``FileNotFoundError`` / ``ValueError`` when the
results are missing or unreadable; the runner then marks the job failed with that message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def nothing(run_dir: Path, log: Path) -> list[Row]:
    """No results of its own: the row reports the exit status and the wall time."""
    return []


def _load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {path.parent}")
    return json.loads(path.read_text())


def _num(m: dict[str, Any], key: str) -> float | None:
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def metrics_json(run_dir: Path, log: Path) -> list[Row]:
    """A training run's (or eval's) ``metrics.json``: held-out PSNR, speed, GPU use."""
    m = _load(run_dir / "metrics.json")
    split = m.get("eval/split") if isinstance(m.get("eval/split"), str) else None
    psnr_key = next((k for k in ("val/psnr", "eval/psnr", "test/psnr") if k in m), None)
    psnr_key = psnr_key or next((k for k in sorted(m) if k.endswith("/psnr")), None)
    prefix = psnr_key.rsplit("/", 1)[0] if psnr_key else "val"
    steps, train_s = _num(m, "steps"), _num(m, "time/train_s")
    row: Row = {
        "psnr": _num(m, psnr_key) if psnr_key else None,
        "psnr_ngp": _num(m, f"{prefix}/psnr_ngp"),
        "ssim": _num(m, f"{prefix}/ssim"),
        "steps": int(steps) if steps is not None else None,
        "train_s": train_s,
        "steps_per_s": steps / train_s if steps and train_s else None,
        "rays_per_s": _num(m, "train/rays_per_s"),
        "samples_per_s": _num(m, "train/samples_per_s"),
        "gpu_util": _num(m, "gpu/utilization_mean"),
        "mem_gb": _num(m, "gpu/mem_peak_gb"),
    }
    notes = []
    if "test/psnr" in m and psnr_key != "test/psnr":
        notes.append(f"test {m['test/psnr']:.3f} dB")
    if split and _num(m, "eval/psnr") is not None and psnr_key and abs(m["eval/psnr"] - m[psnr_key]) > 1e-9:
        notes.append(f"final eval ({split}) {m['eval/psnr']:.3f} dB")
    if _num(m, "perf/forward_imbalance") is not None:
        notes.append(f"imbalance {m['perf/forward_imbalance']:.2f}")
    row["note"] = "; ".join(notes)
    return [row]


def curve_json(run_dir: Path, log: Path) -> list[Row]:
    """``bench.curve``'s ``curve.json``: one row per checkpoint (part ``@15s``)."""
    result = _load(run_dir / "curve.json")
    rows = []
    for p in result["points"]:
        note = ""
        if p.get("bin_steps_per_s_min") is not None:
            note = f"bins {p['bin_steps_per_s_min']:.0f}-{p['bin_steps_per_s_max']:.0f} steps/s"
        gpu = [b["gpu_utilization"] for b in p.get("timeline", []) if b.get("gpu_utilization") is not None]
        if gpu:
            note += f", {min(gpu):.0f}-{max(gpu):.0f} % busy"
        prof = p.get("profile") or {}
        if "wall_over_kernel" in prof:
            note += f"; wall/kernels {prof['wall_over_kernel']:.2f}"
        rows.append({
            "part": f"@{p['checkpoint_s']:g}s",
            "psnr": p.get("psnr"), "psnr_ngp": p.get("psnr_ngp"), "ssim": p.get("ssim"),
            "steps": p.get("steps"),
            "train_s": p.get("train_s"), "steps_per_s": p.get("steps_per_s"),
            "rays_per_s": p.get("rays_per_s"), "samples_per_s": p.get("samples_per_s"),
            "gpu_util": p.get("gpu_utilization"), "mem_gb": p.get("mem_peak_gb"),
            "note": note.lstrip(", "), "timeline": p.get("timeline"),
        })  # fmt: skip
    return rows


_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")


def peers_json(run_dir: Path, log: Path) -> list[Row]:
    """``benchmarks.peers --json``: one row per program and time point of the call (part ``@instant_ngp_60s``,
    ``@nerf_lightning_60s``): PSNR in sRGB over white, instant-ngp's own metric as ``psnr_ngp``, the worst
    view in the note, the per-view PSNRs in ``per_view``."""
    data = _load(run_dir / "peers.json")
    rows = []
    for r in data["rows"]:
        program = re.sub(r"[^a-z0-9]+", "_", r["program"].lower()).strip("_")
        worst = r.get("worst")
        rows.append({
            "part": f"@{program}_{float(r['checkpoint_s']):g}s", "psnr": r.get("psnr"),
            "psnr_ngp": r.get("psnr_ngp"), "steps": r.get("steps"), "train_s": r.get("train_s"),
            "steps_per_s": r.get("steps_per_s"), "per_view": r.get("per_view"),
            "note": f"{r['program']}" + (f"; worst view {worst[0]} {worst[1][0]:.2f} dB" if worst else ""),
        })  # fmt: skip
    return rows


def pytest_summary(run_dir: Path, log: Path) -> list[Row]:
    """pytest's last summary line (``190 passed, 411 deselected in 29.1s``) and its failed test ids."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    summary = next((ln for ln in reversed(lines) if _PYTEST_COUNT.search(ln)), None)
    if summary is None:
        raise ValueError("no pytest summary line in the log")
    counts = {
        k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in _PYTEST_COUNT.findall(summary)
    }
    failed = [ln.split()[1] for ln in lines if ln.startswith(("FAILED ", "ERROR ")) and len(ln.split()) > 1]
    note = summary.strip("= ")
    if failed:
        note += " | " + " ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
    return [{"note": note, "tests": counts, "failed_tests": failed}]


def census_json(run_dir: Path, log: Path) -> list[Row]:
    """``benchmarks.census``: a step's wall time, GPU span, kernel time; ``steps_per_s`` = 1000 / wall ms."""
    c = _load(run_dir / "census.json")
    return [{
        "steps_per_s": 1e3 / c["wall_ms"],
        "note": (
            f"{c['precision']}: wall {c['wall_ms']:.3f} ms, GPU span {c['gpu_span_ms']:.3f}, kernels "
            f"{c['kernel_ms']:.3f} ms in {c['kernels_per_step']:.0f}/step, "
            f"wall/kernels {c['wall_over_kernels']:.2f}"
        ),
        "census": c,
    }]  # fmt: skip


def ops_json(run_dir: Path, log: Path) -> list[Row]:
    """``nerf_lightning.bench.ops --json``: one row per op benchmark; its ratio is CUDA over the reference
    (same run)."""
    data = _load(run_dir / "ops.json")
    rows = []
    for r in data["results"]:
        part = re.sub(r"[^a-z0-9]+", "_", r["name"].lower()).strip("_")
        rows.append({
            "part": f"@{part}", "ratio": r["cuda"] / r["reference"],
            "note": f"{r['cuda']:.3g} vs reference {r['reference']:.3g} {r['unit']}", "op": r,
        })  # fmt: skip
    return rows


def tcnn_json(run_dir: Path, log: Path) -> list[Row]:
    """``benchmarks.tcnn --json``: one row per benchmark; its ratio is tcnn over our kernels (same run), a
    cell that did not run (tcnn absent, a failed capture) in the note."""
    rows = []
    for r in _load(run_dir / "tcnn.json")["rows"]:
        part = re.sub(r"[^a-z0-9]+", "_", r["name"].lower()).strip("_")
        ours, theirs = r.get("cuda", r.get("torch")), r.get("tcnn")
        both = isinstance(ours, float) and isinstance(theirs, float)
        note = f"tcnn {theirs:.4g} vs ours {ours:.4g} {r['unit']}" if both else f"ours {ours}, tcnn {theirs}"
        rows.append({"part": f"@{part}", "ratio": theirs / ours if both else None, "note": note, "tcnn": r})
    return rows


def capture_ab_json(run_dir: Path, log: Path) -> list[Row]:
    """``benchmarks.capture_ab``: one row per variant: held-out and training PSNR, constant-image floor."""
    data = _load(run_dir / "capture_ab.json")
    return [{
        "part": f"@{name}", "psnr": r["heldout_psnr"], "ssim": r["heldout_ssim"], "train_s": r["train_s"],
        "note": f"training {r['train_psnr']:.2f} dB, constant image {r['constant_psnr']:.2f} dB",
    } for name, r in data["rows"].items()]  # fmt: skip


def render_json(run_dir: Path, log: Path) -> list[Row]:
    """``python -m nerf_lightning.render``'s ``render.json``: frames per second of rendering alone."""
    r = _load(run_dir / "render.json")
    return [{
        "frames_per_s": r["render_fps"],
        "note": f"{r['frames']} frames {r['width']}x{r['height']} in {r['render_s']:.1f} s = "
                f"{r['render_fps']:.1f} frames/s",
    }]  # fmt: skip


def viewer_json(run_dir: Path, log: Path) -> list[Row]:
    """``benchmarks.viewer``'s ``viewer_bench.json``: steps/s with ``viewer=off`` and with a client connected
    (``viewer=on``, its speed as a ratio of the first: over the steps while the client orbited when the
    report has them), then frames/s at each canvas size."""
    r = _load(run_dir / "viewer_bench.json")
    rows: list[Row] = []
    if "train" in r:
        off, on = r["train"]["off"], r["train"]["on"]
        for name, m in (("viewer_off", off), ("viewer_on", on)):
            rows.append({"part": f"@{name}", "steps": m["steps"], "steps_per_s": m["steps_per_s"],
                         "psnr": m.get("val/psnr"), "train_s": m.get("time/train_s")})  # fmt: skip
        rows[-1]["ratio"] = on["steps_per_s"] / off["steps_per_s"]
        frames, rate = on["frames_received"], on["frames_per_s"]
        rows[-1]["note"] = f"a client moving the camera: {frames} frames ({rate:.1f}/s)"
        if w := r["train"].get("window"):  # the same steps of both runs, while the client was orbiting
            rows[-1]["ratio"] = w["ratio"]
            rows[-1]["note"] += (
                f"; steps {w['from_step']}-{w['to_step']}: {w['off_steps_per_s']:.1f} -> "
                f"{w['on_steps_per_s']:.1f} steps/s, {100 * w['lost']:.1f} % lost"
            )
    for f in r["fps"]:
        rows.append({
            "part": f"@fps_{f['canvas']}", "frames_per_s": f["fps"],
            "note": f"{f['frame']}: {f['fps']:.1f} frames/s end to end, render {f['render_ms']:.1f} ms/frame",
        })  # fmt: skip
    return rows


def log_lines(pattern: str, limit: int = 6) -> Callable[[Path, Path], list[Row]]:
    """The log's lines that match ``pattern`` (a regex), joined into the note (tools that print a table)."""
    rx = re.compile(pattern)

    def read(run_dir: Path, log: Path) -> list[Row]:
        lines = [ln.strip(" │|") for ln in log.read_text(errors="replace").splitlines() if rx.search(ln)]
        if not lines:
            raise ValueError(f"no line of the log matches {pattern!r}")
        return [{"note": " | ".join(re.sub(r"\s*[│|]\s*", " ", ln) for ln in lines[-limit:])}]

    return read


def jsonl(filename: str, part: str = "tag", **keys: str) -> Callable[[Path, Path], list[Row]]:
    """One row per line of ``{run_dir}/FILENAME`` (a JSON object per line); ``keys`` maps row keys to its
    keys, e.g. ``jsonl("ngp_eval.jsonl", psnr="psnr_srgb_white", steps_per_s="steps_per_s")``."""

    def read(run_dir: Path, log: Path) -> list[Row]:
        path = run_dir / filename
        if not path.is_file():
            raise FileNotFoundError(f"no {filename} in {run_dir}")
        rows = []
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                row: Row = {k: rec.get(src) for k, src in keys.items()}
                row["part"] = f"@{rec.get(part, len(rows))}"
                row["record"] = rec
                rows.append(row)
        return rows

    return read


def step_scaling_json(scene: str) -> Callable[[Path, Path], list[Row]]:
    """``benchmarks.step_scaling --json``: one row per fraction of the batch (part ``@x0.5``) with the step's
    time, rays and samples, the gradient's bytes and the table rows it touches (``benchmarks.batch_rule``)."""

    def read(run_dir: Path, log: Path) -> list[Row]:
        data = _load(run_dir / "step_scaling.json")
        rows = []
        for r in data["scales"]:
            rows.append({
                **r, "part": f"@x{r['scale']:g}", "scene": scene, "steps_per_s": 1e3 / r["step_ms"],
                "note": f"{r['step_ms']:.3f} ms/step, {r['rays_per_step']:.0f} rays, "
                        f"{r['samples_per_step']:.0f} samples; table rows touched "
                        f"{r['touched_fraction'] * 100:.1f} %",
            })  # fmt: skip
        return rows

    return read


def loop_profile_json(run_dir: Path, log: Path) -> list[Row]:
    """A training run with ``benchmarks.loop_profile.LoopProfile``: :func:`metrics_json` plus the window's
    ``loop_ms`` (the loop's step, unprofiled; ``loop_steps_per_s``, its inverse, for speed ratios),
    ``profiled_ms`` and the top functions (``own``, ``cumulative``), the three largest by own time in the
    note."""
    from benchmarks.loop_profile import FILE

    (row,) = metrics_json(run_dir, log)
    data = _load(run_dir / FILE)
    top = ", ".join(f"{name.split(' ', 1)[-1]} {ms:.3f}" for ms, _calls, name in data["own"][:3])
    row.update(
        loop_ms=data["wall_ms_per_step"], loop_steps_per_s=1e3 / data["wall_ms_per_step"],
        profiled_ms=data["profiled_ms_per_step"], own=data["own"], cumulative=data["cumulative"],
        note=f"{data['wall_ms_per_step']:.3f} ms/step in the loop ({data['profiled_ms_per_step']:.3f} "
             f"profiled); own ms/step: {top}",
    )  # fmt: skip
    gpu = data.get("gpu")
    if gpu:  # LoopProfile(kernel_steps > 0): the GPU timeline of a window of steps
        line = gpu["timeline"]
        eager = ", ".join(f"{name} {ms:.3f}" for ms, _calls, name in gpu["eager_ops"][:3])
        row.update(
            gpu_kernel_ms=line["busy_ms"], gpu_gaps_ms=line["gaps_ms"], eager_ops=gpu["eager_ops"],
            syncs=gpu["syncs"], sync_sites=gpu.get("sync_sites", []),
            largest_gaps=line["largest_us_per_step"],
        )
        # kernel time sums every kernel, concurrent ones each: it can exceed the wall
        row["note"] += (
            f"; per step under torch.profiler: {gpu['kernels_per_step']:.0f} kernels, "
            f"{line['busy_ms']:.3f} ms of kernel time, {line['gaps_ms']:.3f} ms between kernels; "
            f"eager: {eager}"
        )
    return [row]


def _run_config(run_dir: Path) -> Any:
    """The run's composed config (``.hydra/config.yaml``, an OmegaConf ``DictConfig``); None without it."""
    from omegaconf import OmegaConf

    path = run_dir / ".hydra" / "config.yaml"
    return OmegaConf.load(path) if path.is_file() else None


def lr_schedule(run_dir: Path) -> str | None:
    """The run's learning-rate decay (``model.scheduler`` in ``.hydra/config.yaml``) where it differs from
    the default config's, as ``"decay from 0.7 every 0.1"``; None where it is the default or unknown."""
    from omegaconf import OmegaConf

    from nerf_lightning.run.config import CONF_DIR

    cfg = _run_config(run_dir)
    if cfg is None:
        return None
    ran = cfg.get("model", {}).get("scheduler", {}) or {}
    default = OmegaConf.load(CONF_DIR / "model" / "ngp.yaml").get("scheduler", {})
    keys = ("decay_start", "decay_interval", "decay_base")
    if any(ran.get(k) is None for k in keys) or all(ran.get(k) == default.get(k) for k in keys):
        return None  # a config without the schedule's keys says nothing about it
    start, every, base = (ran.get(k) for k in keys)
    tail = "" if base == default.get("decay_base") else f" x {base:g}"
    return f"{_rule_decay([start, every])}{tail}"


def rounded_gradients(run_dir: Path) -> str | None:
    """``"bf16"`` where the run rounded its gradients to bfloat16 before each step (a
    ``benchmarks/rounded_gradients.RoundedGradients`` callback in ``.hydra/config.yaml``), else None."""
    cfg = _run_config(run_dir)
    callbacks = (cfg.get("callbacks") if cfg is not None else None) or {}
    targets = {str((c or {}).get("_target_", "")) for c in callbacks.values()}
    return "bf16" if any(t.endswith(".RoundedGradients") for t in targets) else None


def _rule_decay(decay: list[float] | None) -> str | None:
    """A learning-rate decay ``[start, interval]`` (a batch rule's ``batch/decay``) as
    ``"decay from 0.7 every 0.1"``."""
    return None if not decay else f"decay from {decay[0]:g} every {decay[1]:g}"


def val_curve(scene: str, targets: tuple[float, ...] = ()) -> Callable[[Path, Path], list[Row]]:
    """A training run that validated during training: :func:`metrics_json` plus its held-out PSNR after
    each validation (``curve``: [optimizer step, PSNR] from ``csv/metrics.csv``), its batch rule (``k``,
    ``lr_scaling``, ``unit``, ``lr_anneal``, ``mlp_lr_scaling``, ``beta_scaling`` from ``metrics.json``'s
    ``batch/*``), its learning-rate decay where not the default (``schedule``: :func:`lr_schedule`),
    ``gradients`` ("bf16" where rounded: :func:`rounded_gradients`) and the steps to each target."""
    from benchmarks.batch_rule import steps_to

    def read(run_dir: Path, log: Path) -> list[Row]:
        (row,) = metrics_json(run_dir, log)
        m = _load(run_dir / "metrics.json")
        points = csv_points(run_dir / "csv" / "metrics.csv", "val/psnr")
        if not points:
            raise ValueError(f"no val/psnr in {run_dir / 'csv' / 'metrics.csv'}")
        row.update(
            scene=scene, curve=points, k=_num(m, "batch/k") or 1.0,
            lr_scaling=m.get("batch/lr_scaling", "none"), unit=m.get("batch/unit", "steps"),
            lr_anneal=m.get("batch/lr_anneal"), mlp_lr_scaling=m.get("batch/mlp_lr_scaling"),
            beta_scaling=m.get("batch/beta_scaling"), gradients=rounded_gradients(run_dir),
            schedule=lr_schedule(run_dir) or _rule_decay(m.get("batch/decay")),
        )  # fmt: skip
        reach = []
        for t in targets:
            s = steps_to(points, t)
            reach.append(f"{t:g} dB " + ("not reached" if s is None else f"@{s:.0f}"))
        row["note"] = "; ".join(filter(None, [f"k {row['k']:g}, lr {row['lr_scaling']}, {row['unit']}",
                                              ", ".join(reach), row.get("note")]))  # fmt: skip
        return [row]

    return read


def fixed_cost(windows: list[tuple[int, float]], steps: int, train_s: float) -> float | None:
    """Seconds of a run's training time beyond its steps at the steady rate: ``train_s`` less ``steps`` x
    the median step time of the throughput monitor's windows in the second half of the run (``windows``:
    (optimizer step at a window's end, ms per step in it), ``perf/step_time_ms``). What the first steps
    cost (the CUDA graphs' captures, the occupancy warm-up) is in it; None without such windows."""
    late = sorted(ms for step, ms in windows if step > steps / 2)
    if not late or steps <= 0:
        return None
    return train_s - steps * late[len(late) // 2] / 1e3


def ddp_run(scene: str) -> Callable[[Path, Path], list[Row]]:
    """A run timed against one GPU on one or several (experiments ``batch-rule-ddp*``):
    :func:`metrics_json` plus ``scene``, ``world`` (its ranks, ``batch/world_size``), ``rule``
    (``batch/rule``), ``exchange`` (``grad_exchange`` in ``.hydra/config.yaml``), ``length`` (its
    ``trainer.max_steps``: reference steps under a rule in rays, optimizer steps under one in steps) and
    ``fixed_s`` (:func:`fixed_cost`, from ``csv/metrics.csv``; None without it)."""
    def read(run_dir: Path, log: Path) -> list[Row]:
        (row,) = metrics_json(run_dir, log)
        m = _load(run_dir / "metrics.json")
        cfg = _run_config(run_dir)
        if cfg is None:
            raise ValueError(f"no .hydra/config.yaml in {run_dir}: the run's length and exchange are unknown")
        world = _num(m, "batch/world_size")
        if world is None or m.get("batch/rule") is None:
            raise ValueError(f"{run_dir / 'metrics.json'} has no batch/world_size or batch/rule")
        windows = []
        if (run_dir / "csv" / "metrics.csv").is_file():
            windows = csv_points(run_dir / "csv" / "metrics.csv", "perf/step_time_ms")
        fixed = None
        if row.get("steps") and row.get("train_s") is not None:
            fixed = fixed_cost(windows, int(row["steps"]), float(row["train_s"]))
        row.update(
            scene=scene, world=int(world), rule=str(m["batch/rule"]),
            exchange=str(cfg.get("grad_exchange") or "fp32"), length=int(cfg.trainer.max_steps),
            fixed_s=fixed,
        )  # fmt: skip
        row["note"] = "; ".join(filter(None, [f"{row['world']} GPU, {row['rule']}, {row['exchange']}",
                                              row.get("note")]))  # fmt: skip
        return [row]

    return read


def csv_points(path: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of every row of a Lightning ``metrics.csv`` that logged ``key`` (the last per step)."""
    import csv

    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {path.parent}")
    points: dict[int, float] = {}
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            value, step = rec.get(key), rec.get("step")
            if value not in (None, "") and step not in (None, ""):
                points[int(float(step))] = float(value)
    return sorted(points.items())
