"""A/B of the training ray samplers: uniform vs loss-weighted view sampling, several seeds.

    python -m benchmarks.sampler_ab --scene hard --seeds 0 1 2 --steps 2000
    python -m benchmarks.sampler_ab --scene PATH/fox --steps 2000 -- data.downscale=2

``--scene hard`` generates the default synthetic scene plus ``--hard-views`` close-ups of its most
detailed texture (views that a uniform sampler under-trains). Every run trains for the same number of
steps with the same config except ``data.sampler``; the table reports held-out PSNR at the end
(mean and standard deviation over seeds, and per seed), plus the PSNR on the hard views alone when
the scene has any. Results are also written as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from nerf_lightning.apps.train import train
from nerf_lightning.run.config import compose_train_config
from nerf_lightning.utils.io import atomic_write_json

SAMPLERS = ("uniform", "loss_weighted")


def hard_scene(root: Path, hard_views: int) -> Path:
    from nerf_lightning.data.synthetic import generate_scene
    from nerf_lightning.data.synthetic.generate import DEFAULT_SCENE

    out = root / f"default-hard{hard_views}"
    generate_scene(out, **{**DEFAULT_SCENE, "hard_views": hard_views})
    return out


def run(scene: Path, sampler: str, seed: int, steps: int, extra: list[str], out_root: Path) -> dict[str, Any]:
    out_dir = out_root / scene.name / sampler / f"seed{seed}"
    overrides = [
        f"data.path={scene}",
        f"data.sampler={sampler}",
        f"seed={seed}",
        f"trainer.max_steps={steps}",
        "trainer.check_val_every_n_epoch=100000",
        "logger=none",
        "callbacks.progress_bar=null",
        "model.save_val_images=false",
        *extra,
    ]
    cfg = compose_train_config(overrides, out_dir, cwd=Path.cwd())
    metrics = train(cfg)
    return {
        "scene": scene.name,
        "sampler": sampler,
        "seed": seed,
        "steps": steps,
        "overrides": overrides,
        **metrics,
    }


def summarize(results: list[dict[str, Any]]) -> Table:
    table = Table(title="uniform vs loss-weighted view sampling (held-out PSNR at fixed steps)")
    for col in ("scene", "sampler", "val/psnr mean ± sd", "per seed", "train s (mean)"):
        table.add_column(col)
    for scene in sorted({r["scene"] for r in results}):
        for sampler in SAMPLERS:
            rows = [r for r in results if r["scene"] == scene and r["sampler"] == sampler]
            if not rows:
                continue
            psnrs = [r["val/psnr"] for r in rows]
            sd = statistics.stdev(psnrs) if len(psnrs) > 1 else 0.0
            table.add_row(
                scene,
                sampler,
                f"{statistics.mean(psnrs):.2f} ± {sd:.2f}",
                " ".join(f"{p:.2f}" for p in psnrs),
                f"{statistics.mean(r.get('time/train_s', 0.0) for r in rows):.1f}",
            )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scene", action="append", required=True, help="'hard' or a capture folder (repeat)")
    parser.add_argument("--hard-views", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/sampler_ab.json"))
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = parser.parse_args(argv)

    scenes = [
        hard_scene(Path("outputs/scenes"), args.hard_views) if s == "hard" else Path(s) for s in args.scene
    ]
    results = []
    for scene in scenes:
        for seed in args.seeds:
            for sampler in SAMPLERS:
                results.append(
                    run(scene, sampler, seed, args.steps, args.overrides, args.out.parent / "runs")
                )
                atomic_write_json(args.out, results)
    Console().print(summarize(results))


if __name__ == "__main__":
    main()
