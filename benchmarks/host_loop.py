"""The Lightning loop's own cost per step: a training run whose step does (almost) no GPU work.

    python -m benchmarks.host_loop [--start 1000] [--steps 500] -- TRAIN_OVERRIDES...

The training command with its overrides, except that ``TrainStep.forward`` is a stub of the same outputs
(a loss that touches one entry of every parameter, so each gets a dense zero gradient and Adam updates all
of them; zero per-ray losses; every ray valid; the batch's ray count in the statistics). The batch is still
drawn (its graph on a GPU), the stub is still captured as a CUDA graph, Adam, the occupancy grid's update
every 16 steps, the sampler, the callbacks and Lightning's loop all run as in the real run. So the loop's
wall time per step (``benchmarks.loop_profile.LoopProfile``'s window, written to ``loop_profile.json`` in
the run directory, with cProfile's top functions) is what the host needs per step besides the step's own
kernels: when it exceeds the step alone (``benchmarks.census``), the loop is bound by its host, and a
faster step cannot show in steps/s (issue 64: 2.68 ms in the loop against 2.41 for the step alone, H100).

Prints one line: ``host loop: X ms a step (the step stubbed; N steps from S)``. The run's PSNR is
meaningless (the field never trains).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import Tensor

from benchmarks.loop_profile import FILE
from nerf_lightning.data.ray_batch import RayBatch

__all__ = ["main", "stub_forward"]


def stub_forward(step: torch.nn.Module, batch: RayBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``TrainStep.forward``'s outputs at almost no cost: a loss of 0 connected to every parameter."""
    rays_o = batch.rays_o
    params = [p for p in step.parameters() if p.requires_grad]
    loss = torch.stack([p.reshape(-1)[0].float() for p in params]).sum() * 0.0
    n = rays_o.shape[0]
    per_ray = rays_o.new_zeros(n)
    valid = torch.ones(n, dtype=torch.bool, device=rays_o.device)
    stats = torch.zeros(4, dtype=torch.float64, device=rays_o.device)
    stats[0].fill_(float(n))  # a fill kernel, no host-to-device copy: capturable in a CUDA graph
    return loss, per_ray, valid, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=int, default=1000, help="first optimizer step timed")
    parser.add_argument("--steps", type=int, default=500, help="steps timed, then as many profiled")
    parser.add_argument("overrides", nargs="*", help="the training command's overrides (after --)")
    args = parser.parse_args(argv)
    from nerf_lightning.apps import train as train_app
    from nerf_lightning.models.train_step import TrainStep

    real_forward = TrainStep.forward
    TrainStep.forward = stub_forward  # type: ignore[method-assign, assignment]
    window = [
        "+callbacks.loop_profile._target_=benchmarks.loop_profile.LoopProfile",
        f"+callbacks.loop_profile.start={args.start}",
        f"+callbacks.loop_profile.steps={args.steps}",
    ]
    sys.argv = ["nerf_lightning.train", *args.overrides, *window]
    try:
        train_app.main()
    except SystemExit as done:
        if done.code not in (0, None):
            return int(done.code) if isinstance(done.code, int) else 1
    finally:
        TrainStep.forward = real_forward  # type: ignore[method-assign]
    run_dir = _run_dir(args.overrides)
    result = run_dir / FILE if run_dir is not None else None
    if result is None or not result.is_file():
        hint = "pass hydra.run.dir=..., and train >= start + 2 x steps"
        print(f"host_loop: no {FILE} ({hint})", file=sys.stderr)
        return 1
    data = json.loads(result.read_text())
    print(f"host loop: {data['wall_ms_per_step']:.3f} ms a step (the step stubbed; {args.steps} steps from "
          f"{args.start})")  # fmt: skip
    return 0


def _run_dir(overrides: list[str]) -> Path | None:
    for item in overrides:
        if item.startswith("hydra.run.dir="):
            return Path(item.split("=", 1)[1])
    return None


if __name__ == "__main__":
    raise SystemExit(main())
