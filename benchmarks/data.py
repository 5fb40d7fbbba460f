"""Data-path benchmark: image decode cold vs cached, and per-step data time vs training-step time.

    python -m benchmarks.data --path ../shared/data/fox [--downscale 1] [--steps 100]

Data time = ``NeRFDataModule.train_batch`` (sample views/pixels, gather uint8 colours, build rays on
the device). Step time = the configured model's training step (``NeRFModule.train_step_fn``: render,
loss) + backward + an Adam step on that batch. Both are timed after warm-up (device-synchronized); the
table reports their ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from nerf_lightning.apps.train import build_datamodule, build_model
from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.images import load_images
from nerf_lightning.run.config import compose_train_config


def _timed(fn, device: torch.device, iters: int) -> float:
    """Mean seconds per run of ``fn`` over ``iters`` runs (device-synchronized)."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / iters


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", type=Path, required=True)
    parser.add_argument("--downscale", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    capture = load_capture(args.path, downscale=args.downscale)
    frames = capture.train + capture.val
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        load_images(frames, args.downscale, cache_dir=Path(cache))
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_images(frames, args.downscale, cache_dir=Path(cache))
        cached = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as out:
        overrides = [f"data.path={args.path}", f"data.downscale={args.downscale}", *args.overrides]
        if device.type == "cpu":
            overrides.append("experiment=cpu")
        cfg = compose_train_config(overrides, out, cwd=Path.cwd())
        dm = build_datamodule(cfg)
        dm.setup("fit")
        dm.ensure_device(device)
        model = build_model(cfg, dm)[0].to(device)
        step = model.train_step_fn.to(device)
        optimizer = model.optimizer_factory(params=model.parameters())
        batch = dm.train_batch(dm.batch_size)

        def data_step() -> None:
            dm.train_batch(dm.batch_size)

        def train_step() -> None:
            loss = step(batch)[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        # Let the occupancy grid leave its all-occupied start so the step cost is representative.
        for i in range(0, 200, 16):
            model.occupancy.update(i, model.field.density, warmup_steps=0)
        data_s = _timed(data_step, device, args.steps)
        step_s = _timed(train_step, device, max(args.steps // 4, 5))

    table = Table(title=f"data path: {args.path} (downscale {args.downscale}) on {device}")
    for col in ("what", "value"):
        table.add_column(col)
    table.add_row("frames decoded", str(len(frames)))
    table.add_row("decode cold s", f"{cold:.2f}")
    table.add_row("decode cached s", f"{cached:.2f}")
    table.add_row("cold / cached", f"{cold / max(cached, 1e-9):.1f}x")
    table.add_row("rays per step", str(dm.batch_size))
    table.add_row("data ms / step", f"{data_s * 1e3:.3f}")
    table.add_row("train step ms (render+backward+Adam)", f"{step_s * 1e3:.2f}")
    table.add_row("data / (data + step)", f"{100 * data_s / (data_s + step_s):.2f} %")
    Console().print(table)
    return {"decode_cold_s": cold, "decode_cached_s": cached, "data_s": data_s, "step_s": step_s}


if __name__ == "__main__":
    main()
