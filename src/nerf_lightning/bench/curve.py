"""Time to quality: held-out PSNR against seconds of training, the number users compare.

    python -m nerf_lightning.bench.curve [--checkpoints 5,15,60,300] [--out DIR] [--label NAME]
        [--compare OLD.json] [--profile-steps N] [--rate STEPS_PER_S] [--] [train overrides ...]

One training run per checkpoint T (ascending). Each run's ``trainer.max_steps`` is chosen so that
its schedule (learning-rate decay, occupancy warm-up) ends at T: the first run uses ``--rate``
(steps/s; a guess), every later one the rate measured by the run before; a run that misses its T by
more than ``--tolerance`` is repeated once with the measured rate. The table reports the training
time each run actually took. Training time is the training loop only (``time/train_s``: validation
and the CUDA extension build excluded; the CUDA-graph capture included).

Per run: held-out PSNR/SSIM (the module's validation metrics; ``psnr_ngp`` is instant-ngp's own
metric of the same views, ``per_view`` the per-image numbers), steps, steps/s, rays/s, samples/s,
GPU utilization (NVML, mean of the monitor's readings), peak allocator memory, and a timeline:
steps/s and GPU utilization in about 30 bins of equal step count (``timeline``; the slowest and
fastest bin as ``bin_steps_per_s_min``/``_max``), which shows where a long run slowed down. With
``--profile-steps N`` the first run also times N steps late in training without the profiler and
then N steps under ``torch.profiler``: wall time per step against the summed kernel time, split
into encoding, MLP, marching, compositing, optimizer and other kernels.

Writes ``curve.json`` (and ``curve.png`` when matplotlib is installed: PSNR against seconds, with
the ``--compare`` curve) into ``--out``; prints a table last. Runs on the GPU, and on the CPU with
the CPU preset (added without a GPU, as by the train app) and small checkpoints (``--checkpoints 20,40``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from nerf_lightning.apps.entry import normalize_argv
from nerf_lightning.apps.train import train, with_device_preset
from nerf_lightning.callbacks.throughput import ThroughputMonitor
from nerf_lightning.run.config import compose_train_config

#: Overrides of every benchmark run: one validation at the end, no best-by-PSNR checkpoints. The rest
#: (last.ckpt on its default cadence, progress bar, loggers, monitors) stays as configured: their cost
#: is part of the number, as in every user's run.
BENCH_OVERRIDES = [
    "trainer.check_val_every_n_epoch=1000000",
    "callbacks.model_checkpoint=null",
    "trainer.enable_model_summary=false",
]

#: Kernel-name patterns of the profile breakdown, first match wins.
KERNEL_GROUPS = (
    ("encoding", re.compile(r"hash_(fwd|bwd)|sh_fwd")),
    ("marching", re.compile(r"march_kernel|ray_aabb")),
    ("compositing", re.compile(r"volume_render|render_weights")),
    ("mlp", re.compile(r"gemm|gemv|cutlass|xmma|cublas|sm90_|sm80_|ampere_|nvjet", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("occupancy", re.compile(r"grid_(splat|ema|cell)|pack_bits")),
)
#: CUDA runtime calls that make the host wait for the device.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


class _RateTimeline(L.Callback):
    """Where in a run the step rate went: the throughput monitor's windows (this rank's steps,
    seconds and GPU utilization, read at its own host syncs) merged into about ``n_bins`` bins of
    equal step count. No reading of its own: it adds no sync."""

    def __init__(self, n_bins: int = 30) -> None:
        self.n_bins = n_bins
        self.bins: list[dict[str, float]] = []
        self._monitor: Any = None
        self._seen = -1
        self._bin_steps = 1
        self._acc = [0.0, 0.0, 0.0, 0.0]  # steps, seconds, seconds with a GPU reading, busy-seconds

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._monitor = next((c for c in trainer.callbacks if isinstance(c, ThroughputMonitor)), None)
        self._bin_steps = max(1, int(trainer.max_steps or 0) // self.n_bins)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        mon = self._monitor
        if mon is None or mon.latest_step < 0 or mon.latest_step == self._seen:
            return
        self._seen = mon.latest_step
        w = mon.latest_local
        acc = self._acc
        acc[0] += w["steps"]
        acc[1] += w["seconds"]
        if w["gpu_util"] >= 0:
            acc[2] += w["seconds"]
            acc[3] += w["gpu_util"] * w["seconds"]
        if acc[0] >= self._bin_steps:
            self._close(mon.latest_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._acc[0] > 0:
            self._close(self._seen)

    def _close(self, step: int) -> None:
        steps, seconds, gpu_s, busy = self._acc
        self.bins.append({
            "end_step": int(step),
            "steps": int(steps),
            "steps_per_s": steps / max(seconds, 1e-9),
            "gpu_utilization": busy / gpu_s if gpu_s > 0 else None,
        })  # fmt: skip
        self._acc = [0.0, 0.0, 0.0, 0.0]


class _StepProfile(L.Callback):
    """Times ``n`` steps plainly, then ``n`` under torch.profiler, ending ``margin`` steps before the end."""

    def __init__(self, n: int, margin: int = 20) -> None:
        self.n, self.margin = n, margin
        self.result: dict[str, Any] = {}
        self._start: int | None = None
        self._t0 = 0.0
        self._prof: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = max(1, trainer.max_steps - self.margin - 2 * self.n)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == self._start:
            torch.cuda.synchronize()
            self._t0 = time.perf_counter()
        elif step == self._start + self.n:
            torch.cuda.synchronize()
            self.result["wall_ms_per_step"] = (time.perf_counter() - self._t0) / self.n * 1e3
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self._prof = torch.profiler.profile(activities=acts)
            self._prof.__enter__()
            self._t0 = time.perf_counter()
        elif step == self._start + 2 * self.n and self._prof is not None:
            torch.cuda.synchronize()
            profiled_ms = (time.perf_counter() - self._t0) / self.n * 1e3
            self._prof.__exit__(None, None, None)
            self.result.update(self._breakdown(self._prof, profiled_ms))
            self._prof = None

    def _breakdown(self, prof: Any, profiled_ms: float) -> dict[str, Any]:
        groups: dict[str, float] = {name: 0.0 for name, _ in KERNEL_GROUPS}
        groups["other"] = 0.0
        top: list[tuple[float, str]] = []
        counts: list[tuple[float, float, str]] = []
        host: list[tuple[float, int, str]] = []
        syncs: dict[str, float] = {}
        for evt in prof.key_averages():
            name = evt.key
            if name.startswith(
                ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
            ) or (name.startswith("cudaMemcpy") and "Async" not in name):
                syncs[name] = evt.count / self.n
            cpu = float(getattr(evt, "self_cpu_time_total", 0.0) or 0.0)
            if cpu > 0:
                host.append((cpu / 1e3 / self.n, evt.count // self.n, name[:60]))
            t = float(getattr(evt, "self_device_time_total", 0.0) or 0.0)
            # kernels only: record_function ranges (e.g. "Optimizer.step#Adam.step") also carry a
            # device time, the span of the GPU work queued inside them
            annotation = (
                getattr(evt, "is_user_annotation", False) or "#" in name or name.startswith("Profiler")
            )
            if t <= 0 or annotation or getattr(evt, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            group = next((g for g, pat in KERNEL_GROUPS if pat.search(name)), "other")
            groups[group] += t / 1e3 / self.n  # us -> ms per step
            top.append((t / 1e3 / self.n, name[:80]))
            counts.append((evt.count / self.n, t / 1e3 / self.n, name[:80]))
        kernel_ms = sum(groups.values())
        wall = self.result.get("wall_ms_per_step", profiled_ms)
        return {
            "kernel_ms_per_step": kernel_ms,
            "profiled_wall_ms_per_step": profiled_ms,
            "wall_over_kernel": wall / kernel_ms if kernel_ms > 0 else math.inf,
            "groups_ms_per_step": groups,
            "host_gap_ms_per_step": max(wall - kernel_ms, 0.0),
            "top_kernels_ms_per_step": sorted(top, reverse=True)[:12],
            # every kernel costs ~2-4 us of launch and ramp on the GPU even inside a graph: the count
            # says how much of the wall/kernel gap fusion could recover
            "kernels_per_step": sum(c for c, _, _ in counts),
            "top_kernels_by_count": sorted(counts, reverse=True)[:40],
            "top_host_ops_ms_per_step": sorted(host, reverse=True)[:25],
            "syncs_per_step": syncs,
        }


def run_once(overrides: list[str], out_dir: Path, max_steps: int, profile_steps: int = 0) -> dict[str, Any]:
    """Train one configuration for ``max_steps``; returns train()'s metrics (+ the profile)."""
    cfg = compose_train_config([*overrides, *BENCH_OVERRIDES, f"trainer.max_steps={max_steps}"], out_dir)
    profiler = _StepProfile(profile_steps) if profile_steps > 0 and torch.cuda.is_available() else None
    timeline = _RateTimeline()
    metrics = train(cfg, extra_callbacks=[timeline] + ([profiler] if profiler is not None else []))
    if profiler is not None:
        metrics["profile"] = profiler.result
    metrics["timeline"] = timeline.bins
    return metrics


def curve(
    overrides: list[str],
    checkpoints: list[float],
    out: Path,
    rate: float,
    tolerance: float = 0.15,
    profile_steps: int = 0,
) -> list[dict[str, Any]]:
    """One run per checkpoint; returns the points (see the module docstring)."""
    points = []
    for i, target in enumerate(sorted(checkpoints)):
        for attempt in range(2):
            steps = max(5, int(round(rate * target)))
            t0 = time.perf_counter()
            m = run_once(overrides, out / f"t{target:g}_{attempt}", steps, profile_steps if i == 0 else 0)
            train_s = float(m.get("time/train_s", time.perf_counter() - t0))
            rate = steps / max(train_s, 1e-6)
            if abs(train_s / target - 1.0) <= tolerance:
                break
            print(f"[curve] {target:g} s: ran {train_s:.1f} s ({steps} steps); again at {rate:.1f} steps/s")
        point = {
            "checkpoint_s": target,
            "train_s": train_s,
            "steps": int(m.get("steps", steps)),
            "steps_per_s": steps / max(train_s, 1e-6),
            "psnr": m.get("val/psnr"),
            "psnr_ngp": m.get("val/psnr_ngp"),
            "psnr_black": m.get("val/psnr_black"),
            "ssim": m.get("val/ssim"),
            "rays_per_s": m.get("train/rays_per_s"),
            "samples_per_s": m.get("train/samples_per_s"),
            "gpu_utilization": m.get("gpu/utilization_mean"),
            "mem_peak_gb": m.get("gpu/mem_peak_gb"),
        }
        point["timeline"] = m["timeline"]
        point["per_view"] = m.get("val/per_view")  # which held-out view is how good
        rates = [b["steps_per_s"] for b in point["timeline"]]
        if rates:  # a long run that slows down part-way shows it here (the bins are in "timeline")
            point["bin_steps_per_s_min"], point["bin_steps_per_s_max"] = min(rates), max(rates)
        if "profile" in m:
            point["profile"] = m["profile"]
        points.append(point)
        shown = {k: v for k, v in point.items() if k not in ("profile", "timeline", "per_view")}
        print(f"[curve] {json.dumps(shown)}", flush=True)
    return points


def plot(result: dict[str, Any], path: Path, compare: dict[str, Any] | None) -> bool:
    """PSNR against training seconds (log x) as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[curve] matplotlib is not installed: no PNG (pip install matplotlib)")
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for res, style in ((result, "o-"), (compare, "s--")):
        if res:
            pts = res["points"]
            ax.plot([p["train_s"] for p in pts], [p["psnr"] for p in pts], style, label=res.get("label", "?"))
    ax.set_xscale("log")
    ax.set_xlabel("training time [s]")
    ax.set_ylabel("held-out PSNR [dB]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[own arguments] -- [train overrides]`` -> (own arguments, overrides)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    # the train app's reading of its overrides, the CPU preset included when there is no GPU
    overrides = with_device_preset(normalize_argv(overrides, open_nodes=()), torch.cuda.is_available())
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", default="5,15,60,300", help="seconds of training, comma-separated")
    p.add_argument("--out", default="outputs/bench/curve", type=Path)
    p.add_argument("--label", default=None)
    p.add_argument("--compare", type=Path, default=None, help="an earlier curve.json to plot alongside")
    p.add_argument("--rate", type=float, default=None, help="first guess of steps/s (GPU 250, CPU 4)")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--profile-steps", type=int, default=0)
    args = p.parse_args(argv)
    checkpoints = [float(c) for c in args.checkpoints.split(",") if c]
    rate = args.rate or (250.0 if torch.cuda.is_available() else 4.0)
    torch.set_float32_matmul_precision("high")  # as `python -m nerf_lightning.train`
    args.out.mkdir(parents=True, exist_ok=True)
    points = curve(overrides, checkpoints, args.out, rate, args.tolerance, args.profile_steps)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    result = {
        "label": args.label or " ".join(overrides) or "default",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "command": "python -m nerf_lightning.bench.curve " + " ".join(sys.argv[1:] if argv is None else argv),
        "overrides": overrides,
        "points": points,
    }
    (args.out / "curve.json").write_text(json.dumps(result, indent=2))
    compare = json.loads(args.compare.read_text()) if args.compare else None
    plot(result, args.out / "curve.png", compare)
    print(f"\n{result['label']} on {device}")
    cols = ("T [s]", "ran [s]", "steps", "PSNR", "steps/s", "Mrays/s", "Msmp/s", "gpu%")
    print(" ".join(f"{c:>8}" for c in cols))
    for pt in points:
        row = (
            pt["checkpoint_s"],
            pt["train_s"],
            pt["steps"],
            pt["psnr"],
            pt["steps_per_s"],
            (pt["rays_per_s"] or 0) / 1e6,
            (pt["samples_per_s"] or 0) / 1e6,
            pt["gpu_utilization"],
        )
        print(" ".join(f"{float('nan') if v is None else v:>8.2f}" for v in row))
    for pt in points:
        if "bin_steps_per_s_min" in pt:
            print(f"{pt['checkpoint_s']:>8.2f} s run: steps/s over {len(pt['timeline'])} bins "
                  f"{pt['bin_steps_per_s_min']:.1f}-{pt['bin_steps_per_s_max']:.1f}")  # fmt: skip
    prof = next((pt["profile"] for pt in points if pt.get("profile")), None)
    if prof and "kernel_ms_per_step" in prof:
        groups = " ".join(f"{k} {v:.3f}" for k, v in prof["groups_ms_per_step"].items())
        print(
            f"profile: wall {prof['wall_ms_per_step']:.3f} ms/step, kernels {prof['kernel_ms_per_step']:.3f}"
        )
        print(f"  wall/kernel x{prof['wall_over_kernel']:.2f}; per step [ms]: {groups}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
