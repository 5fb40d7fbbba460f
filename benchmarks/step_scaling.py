"""Time per training step against rays per step: the graphed step alone, at fractions of the batch.

    python -m benchmarks.step_scaling [--scales 1,0.5,0.25,0.125] [--precision bf16-mixed]
        [--warmup 400] [--steps 300] [--json PATH] [--device cuda|cpu] -- TRAIN OVERRIDES (the capture)

Scale ``s`` is the step one rank runs when a batch is split over ``N = 1/s`` GPUs: the sample
budget and the ray slots times ``s`` (``TrainStep.set_capacity_scale``, the DataModule's
``batch_size // N``); ``s = 1`` is every rank's step under ``per_device``. Each scale trains a
model of its own from scratch for ``--warmup`` steps (past the occupancy warm-up: the grid has emptied as
late in training), then the wall time of ``--steps`` steps is measured (host and GPU overlapped, as in
training; the batch and the step replayed from their CUDA graphs, fused Adam, an occupancy update every
16 steps). Also measured, for the cost of exchanging gradients between GPUs (``benchmarks/batch_rule.py``):
the gradient's bytes, what DDP all-reduces every step, and the fraction of the hash table's rows that one
step's gradient touches (per level: the rest of the table's gradient is exactly zero). And for the work
that N ranks share instead of repeating, each alone on the GPU at shares 1, 1/2, 1/4, 1/8: the occupancy
update's time when a rank evaluates ``1/N`` of its cells (``OccupancyGrid.update(share=...)``, as training
does on N ranks), and fused Adam's time over ``1/N`` of the parameters (what a rank would step if the
optimizer were sharded).

``--device cpu`` runs the same code eagerly on a CPU-sized config (a check of the tool, not a timing).
Writes ``--json`` (``readers.step_scaling_json`` reads it) and prints one line per scale.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.census import PRECISIONS, gpu_span, split_overrides, top_functions
from benchmarks.step_harness import GRID_EVERY, BudgetedStep

#: numbers of ranks whose share of the occupancy update and of Adam is timed
SHARED_RANKS = [1, 2, 4, 8]


def shared_work_ms(harness: BudgetedStep, ranks: list[int]) -> dict[str, dict[str, float]]:
    """GPU span (``census.gpu_span``: the host out of the way) of the work that N ranks can share: the
    occupancy update with one rank's ``1/N`` of the cells, and fused Adam over ``1/N`` of every parameter
    (flat slices that share the parameters' storage, with one step's gradients)."""
    if harness.device.type != "cuda":
        return {}
    harness.forward_backward()  # gradients for Adam's slices (scaled, as the step leaves them)
    params = [p for p in harness.model.parameters() if p.grad is not None]
    grid, adam = {}, {}
    for n in ranks:
        grid[str(n)] = gpu_span(lambda i, n=n: harness.update_grid(10_000 + i, n))[0]
        slices = []
        for p in params:
            m = -(-p.numel() // n)
            view = p.detach().view(-1)[:m]
            view.grad = p.grad.detach().view(-1)[:m].clone()
            slices.append(view)
        opt = torch.optim.Adam(slices, lr=1e-9, eps=1e-15, betas=(0.9, 0.99), fused=True)
        adam[str(n)] = gpu_span(lambda i, opt=opt: opt.step())[0]
        del opt, slices
    harness.opt.zero_grad(set_to_none=True)
    return {"grid_update_ms": grid, "adam_ms": adam}


def host_profile(harness: BudgetedStep, steps: int, top: int = 25) -> list[tuple[float, float, str]]:
    """Where the host's time per step goes: ``(ms per step, calls per step, function)`` of the ``top``
    functions by own time over ``steps`` steps (cProfile; the GPU is synchronised once, at the end)."""
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    for i in range(steps):
        harness.step(i, update=False)
    prof.disable()
    harness.sync()
    return top_functions(prof, steps, top)


def measure(
    overrides: list[str],
    scales: list[float],
    precision: str,
    warmup: int,
    steps: int,
    work: Path,
    device: str,
) -> dict[str, Any]:
    """Time the step at each scale (module docstring); the data are loaded once."""

    from nerf_lightning.apps.train import build_datamodule
    from nerf_lightning.run.config import compose_train_config

    torch.set_float32_matmul_precision("high")  # as `python -m nerf_lightning.train`
    cfg = compose_train_config(["logger=csv", *overrides], work)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    dm.ensure_device(torch.device(device))
    rows = []
    for scale in scales:
        harness = BudgetedStep(cfg, dm, precision, scale, device)
        for i in range(warmup):
            harness.step(i)
        harness.sync()
        t = time.perf_counter()
        rays = samples = 0.0
        for i in range(steps):
            stats = harness.step(i)
            rays, samples = rays + stats[0], samples + stats[2]  # device sums: no sync per step
        harness.sync()
        wall = (time.perf_counter() - t) / steps
        span = host = {}
        if device == "cuda":
            span_ms, enqueue_ms = gpu_span(partial(harness.step, update=False))
            span = {"gpu_span_ms": span_ms, "host_enqueue_ms": enqueue_ms}
            host = {"host_top": host_profile(harness, 64)}
        row = {
            "scale": scale,
            "step_ms": wall * 1e3,
            **span,
            "rays_per_step": float(rays) / steps,
            "samples_per_step": float(samples) / steps,
            "sample_budget": harness.model.train_step_fn.sample_budget,
            "ray_slots": harness.n_rays,
            **harness.gradient_census(),
            "grid_update_every": GRID_EVERY,
            "grid_bytes": harness.model.occupancy.density_grid.numel() * 4,
            **shared_work_ms(harness, SHARED_RANKS),
            **host,
        }
        rows.append(row)
        print(
            f"step_scaling x{scale:g}: {row['step_ms']:.3f} ms/step, {row['rays_per_step']:.0f} rays, "
            f"{row['samples_per_step']:.0f} samples per step; GPU span {row.get('gpu_span_ms', 0):.3f} ms, "
            f"host {row.get('host_enqueue_ms', 0):.3f} ms; gradient {row['grad_bytes'] / 1e6:.1f} MB, "
            f"table rows touched {row['touched_fraction'] * 100:.1f} %; grid update of 1/N of the cells "
            + ", ".join(f"N={n} {ms:.3f}" for n, ms in row.get("grid_update_ms", {}).items())
            + " ms; Adam over 1/N "
            + ", ".join(f"N={n} {ms:.3f}" for n, ms in row.get("adam_ms", {}).items())
            + " ms",
            flush=True,
        )
        del harness
        if device == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "precision": precision,
        "overrides": overrides,
        "warmup": warmup,
        "steps": steps,
        "scales": rows,
    }


def main(argv: list[str] | None = None) -> int:
    argv, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="1,0.5,0.25,0.125", help="fractions of the batch (default B..B/8)")
    p.add_argument("--precision", default="bf16-mixed", choices=PRECISIONS)
    p.add_argument("--warmup", type=int, default=400, help="untimed steps per scale")
    p.add_argument("--steps", type=int, default=300, help="timed steps per scale")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.step_scaling needs an NVIDIA GPU (--device cpu checks the tool)", file=sys.stderr)
        return 2
    try:
        scales = [float(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        print(f"error: --scales: comma-separated numbers expected, got {args.scales!r}", file=sys.stderr)
        return 2
    if not scales or any(not 0 < s <= 64 for s in scales):
        print(f"error: --scales: numbers in (0, 64] expected, got {args.scales!r}", file=sys.stderr)
        return 2
    work = (args.json.parent if args.json else Path("outputs/bench")) / "step_scaling_run"
    result = measure(overrides, scales, args.precision, args.warmup, args.steps, work, args.device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
