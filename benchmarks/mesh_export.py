"""Export a checkpoint as glb and as ply at equal triangles; time, size, held-out PSNR; a screenshot.

    python -m benchmarks.mesh_export RUN [--views N] [--width W] \
        [--shot PNG [--shot-view I] [--shot-width W]] [--json PATH] [ARGS...]

ARGS are ``export mesh`` overrides (``resolution=256 texture_size=2048``). The PSNR is
:func:`benchmarks.mesh_render.held_out_psnr` (the mesh ray-cast from the held-out cameras against the
field's renders), over the first ``--views`` held-out views at most ``--width`` pixels wide. The
screenshot is the glb ray-cast from a held-out camera (``--shot-view``, the first by default) scaled
to 512 pixels wide (``--shot-width``). ``--json`` writes the rows (atomically) besides printing them; the
rows carry the training run's steps, seconds and held-out PSNR (its metrics.json) under ``training``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _screenshot(mesh, run_dir: Path, up: str, path: Path, view: int = 0, width: int = 512) -> None:  # noqa: ANN001
    """The mesh seen from held-out camera ``view`` (:func:`benchmarks.mesh_render.shade`), its intrinsics
    scaled to ``width`` pixels (the README's picture)."""
    import dataclasses

    import imageio.v3 as iio

    from benchmarks.mesh_render import held_out_views, shade, view_rays
    from nerf_lightning.data.scene_space import SceneSpace
    from nerf_lightning.run.restore import load_run

    capture, frames = held_out_views(load_run(run_dir))
    frame = frames[view]
    k, intr = width / frame.intrinsics.width, frame.intrinsics
    intr = dataclasses.replace(intr, width=width, height=round(intr.height * k), fx=intr.fx * k,
                               fy=intr.fy * k, cx=intr.cx * k, cy=intr.cy * k)  # fmt: skip
    _, _, o, d, (h, w) = view_rays(dataclasses.replace(frame, intrinsics=intr), SceneSpace.of(capture), up)
    rgb, _ = shade(mesh, o, d)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, (rgb.reshape(h, w, 3) * 255).round().astype(np.uint8))


#: the training run's metrics.json entries the rows repeat (``training``)
TRAINING_KEYS = ("steps", "time/train_s", "eval/psnr", "eval/split", "eval/n_views", "eval/n_split_views")


def training_summary(run_dir: Path) -> dict[str, Any]:
    """The run's steps, training seconds and final held-out PSNR (its metrics.json; empty without one)."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return {}
    metrics = json.loads(path.read_text())
    return {k: metrics[k] for k in TRAINING_KEYS if k in metrics}


def main(argv: list[str] | None = None) -> dict:
    import trimesh
    from hydra.core.global_hydra import GlobalHydra

    from benchmarks.mesh_render import held_out_psnr
    from nerf_lightning.apps.export import export
    from nerf_lightning.run.config import compose_app_config
    from nerf_lightning.utils.io import atomic_write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument(
        "--shot", type=Path, default=None, help="a 512-px PNG of the glb from a held-out view"
    )
    parser.add_argument("--shot-view", type=int, default=0, help="which held-out view (index)")
    parser.add_argument("--shot-width", type=int, default=512, help="the screenshot's width in pixels")
    parser.add_argument("--views", type=int, default=None, help="score the first N held-out views only")
    parser.add_argument("--width", type=int, default=None, help="score views at most W pixels wide")
    parser.add_argument("--json", type=Path, default=None, help="write the rows there too")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("glb", "ply"):
            cfg = compose_app_config("export", ["what=mesh", f"ckpt={args.run}", f"format={fmt}",
                                                *args.overrides], Path(tmp) / fmt)  # fmt: skip
            GlobalHydra.instance().clear()
            info = export(cfg)
            print(f"[mesh_export] {fmt}: {info['seconds']:.1f} s, stages {info['stage_seconds']}", flush=True)
            mesh = trimesh.load(info["mesh"], force="mesh", process=False)
            t0 = time.perf_counter()
            psnr = held_out_psnr(args.run, mesh, info["up"], args.views, args.width, str(cfg.space))
            scored = time.perf_counter() - t0
            print(f"[mesh_export] {fmt}: held-out PSNR {psnr:.2f} dB in {scored:.1f} s", flush=True)
            size = sum(Path(p).stat().st_size for p in info["files"])
            rows[fmt] = {"seconds": round(info["seconds"], 1), "triangles": info["faces"], "bytes": size,
                         "texture_size": info["texture_size"], "psnr": round(psnr, 2),
                         "stage_seconds": info["stage_seconds"]}  # fmt: skip
            if fmt == "glb" and args.shot is not None:
                _screenshot(mesh, args.run, info["up"], args.shot, args.shot_view, args.shot_width)
    rows["overrides"] = args.overrides
    rows["training"] = training_summary(args.run)
    print(json.dumps(rows, indent=2), flush=True)
    if args.json is not None:
        atomic_write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
