"""Where the wall time of a training step goes: the graphed step outside Lightning, one precision per run.

    python -m benchmarks.census [--precision 32-true|bf16-mixed|16-mixed] [--path CAPTURE]
        [--json PATH] [-- train overrides ...]

The step is what training replays on a GPU: the training batch drawn by its CUDA graph, the budgeted step
(march, field, compositing, loss and backward) captured as CUDA graphs with the batch graph's buffers as
its inputs, fused Adam, the occupancy grid updated every 16 steps. Measures, after warm-up:

- **wall** per step, host and GPU overlapped as in training;
- the **GPU span** per step with the host kept out of the way: a sleep kernel holds the GPU while the host
  enqueues 16 steps, which the GPU then runs back to back. GPU span close to wall: the gap between kernels
  is on the GPU (the launch and ramp of many small kernels; fusing them helps). Span close to the kernel
  time while wall is larger: the host cannot keep up;
- the summed **kernel time** and **kernels per step** (torch.profiler), the largest kernels and the largest
  gaps between consecutive kernels.

16-mixed scales the loss as Lightning's precision plugin does: without it the fp16 gradients underflow,
the field empties and the step measures less work. Needs an NVIDIA GPU and the capture (default
``.devdata/lego``, an ``experiment=blender`` scene).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")


def census(path: str, precision: str, overrides: list[str], work: Path) -> dict[str, Any]:
    """Measure the step of ``path``'s default model at ``precision`` (see the module docstring)."""

    from benchmarks.step_harness import BudgetedStep
    from nerf_lightning.apps.train import build_datamodule
    from nerf_lightning.run.config import compose_train_config

    torch.set_float32_matmul_precision("high")  # as `python -m nerf_lightning.train`
    cfg = compose_train_config(["experiment=blender", f"data.path={path}", "logger=csv", *overrides], work)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    dm.ensure_device(torch.device("cuda"))
    # the batch and the step replayed from their graphs, fused Adam, the grid updated every 16 steps
    one = BudgetedStep(cfg, dm, precision).step

    for i in range(400):  # past the occupancy warm-up: the grid has emptied, as late in training
        one(i)
    torch.cuda.synchronize()
    n = 320
    t = time.perf_counter()
    for i in range(n):
        stats = one(i)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / n * 1e3

    span, enqueue = gpu_span(lambda i: one(i, update=False))  # no occupancy update inside the span

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(1, 33):
            one(i, update=False)
        torch.cuda.synchronize()
    count, kern = Counter(), Counter()
    for e in prof.key_averages():
        if (
            e.device_type == torch.autograd.DeviceType.CUDA
            and "#" not in e.key
            and e.self_device_time_total > 0
        ):
            count[e.key[:70]] += e.count / 32
            kern[e.key[:70]] += e.self_device_time_total / 32 / 1e3
    kernel_ms = sum(kern.values())
    per_kernel_us = {k: kern[k] / max(c, 1e-9) * 1e3 for k, c in count.items()}
    small = [k for k, us in per_kernel_us.items() if us < 5]
    return {
        "precision": precision,
        "capture": path,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "wall_ms": wall,
        "gpu_span_ms": span,
        "host_enqueue_ms": enqueue,
        "kernel_ms": kernel_ms,
        "kernels_per_step": sum(count.values()),
        "wall_over_kernels": wall / kernel_ms,
        "small_kernels_per_step": sum(count[k] for k in small),
        "small_kernels_ms": sum(kern[k] for k in small),
        "rays_per_step": float(stats[0]),
        "top_kernels": sorted(((kern[k], count[k], k) for k in kern), reverse=True)[:30],
        "gaps": timeline_gaps(prof, 32),
    }


def gpu_span(step: Callable[[int], Any], n: int = 16, repeats: int = 8) -> tuple[float, float]:
    """(GPU span, host enqueue time) of one ``step(i)`` in ms, medians over ``repeats``: a sleep kernel
    holds the GPU while the host enqueues ``n`` steps, which the GPU then runs back to back, so the span
    is the step's time with the host out of the way and the enqueue time is the host's cost of a step."""
    spans, enqueue = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time, longer than the host needs for n steps
        start.record()
        t = time.perf_counter()
        for i in range(n):
            step(i)
        enqueue.append((time.perf_counter() - t) / n * 1e3)
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end) / n)
    return sorted(spans)[len(spans) // 2], sorted(enqueue)[len(enqueue) // 2]


def top_functions(
    prof: Any, steps: int, top: int = 25, cumulative: bool = False
) -> list[tuple[float, float, str]]:
    """``(ms per step, calls per step, function)`` of the ``top`` functions of a ``cProfile.Profile`` run
    over ``steps`` steps, by own time (or by cumulative time)."""
    import pstats

    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [
        ((ct if cumulative else tt) / steps * 1e3, nc / steps, f"{Path(file).name}:{line} {name}")
        for (file, line, name), (_cc, nc, tt, ct, _callers) in stats.items()
    ]
    return sorted(rows, reverse=True)[:top]


def timeline_gaps(prof: Any, steps: int) -> dict[str, Any]:
    """The GPU timeline of the profiled steps: time between consecutive kernels, by size and by pair."""
    evs = sorted(
        (e.time_range.start, e.time_range.end, e.name[:50])
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    pairs: Counter = Counter()
    sizes: Counter = Counter()
    total = 0.0
    edges = ((1, "<1us"), (3, "1-3us"), (6, "3-6us"), (12, "6-12us"), (50, "12-50us"))
    for (s0, e0, n0), (s1, _e1, n1) in zip(evs, evs[1:], strict=False):
        g = max(0.0, s1 - max(e0, s0))
        total += g
        sizes[next((name for edge, name in edges if g < edge), ">50us")] += 1 / steps
        pairs[f"{n0} -> {n1}"] += g / steps
    return {
        "span_ms": (evs[-1][1] - evs[0][0]) / steps / 1e3 if evs else 0.0,
        "busy_ms": sum(e - s for s, e, _ in evs) / steps / 1e3,
        "gaps_ms": total / steps / 1e3,
        "sizes_per_step": dict(sizes),
        "largest_us_per_step": pairs.most_common(15),
    }


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """A bench tool's command line: (its options, the training overrides after ``--``)."""
    if "--" not in argv:
        return list(argv), []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="32-true", choices=PRECISIONS)
    p.add_argument("--path", default=".devdata/lego", help="a Blender-format capture (default .devdata/lego)")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.census needs an NVIDIA GPU", file=sys.stderr)
        return 2
    work = (args.json.parent if args.json else Path("outputs/bench")) / "census_run"
    c = census(args.path, args.precision, overrides, work)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(c, indent=1))
    print(
        f"census {c['precision']}: wall {c['wall_ms']:.3f} ms/step | GPU span (host out of the way) "
        f"{c['gpu_span_ms']:.3f} | host enqueue {c['host_enqueue_ms']:.3f} | kernels {c['kernel_ms']:.3f} ms "
        f"in {c['kernels_per_step']:.0f} launches/step | wall/kernels {c['wall_over_kernels']:.2f}"
    )
    print(
        f"  kernels < 5 us each: {c['small_kernels_per_step']:.0f} per step, {c['small_kernels_ms']:.3f} ms"
    )
    for ms, n, name in c["top_kernels"]:
        print(f"  {n:6.1f}x {ms / max(n, 1e-9) * 1e3:7.1f} us  {name}")
    g = c["gaps"]
    sizes = ", ".join(f"{k} {v:.0f}" for k, v in sorted(g["sizes_per_step"].items()))
    print(f"timeline: span {g['span_ms']:.3f} ms/step, busy {g['busy_ms']:.3f}, gaps {g['gaps_ms']:.3f}")
    print(f"  gap sizes per step: {sizes}")
    for pair, us in g["largest_us_per_step"]:
        print(f"  gap {us:7.1f} us/step  {pair}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
