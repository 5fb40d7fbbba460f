"""A/B of training variants on one capture: held-out vs training PSNR after a fixed number of steps.

Built to find out why a real capture does not reconstruct (the ``fruit`` phone capture,
``docs/investigations/2026-11-30-fruit-failure.md``):
held-out PSNR at the level of a constant image while the training PSNR climbs is the signature of a
model that memorizes the views instead of forming geometry. Each variant is the default training
(``NeRFModule.training_step``, whatever the current recipe) plus a few config overrides::

    python -m benchmarks.capture_ab --path ../shared/data/fruit --steps 2000
    python -m benchmarks.capture_ab --path ../shared/data/fruit --variants baseline,near_0.2
    python -m benchmarks.capture_ab --path CAPTURE --variant mse="model.net.loss.kind=mse"
    python -m benchmarks.capture_ab --path ../shared/data/fruit --cpu-repro --steps 400

``--cpu-repro`` adds :data:`CPU_REPRO` to every variant: the fruit failure's reproduction on a CPU at
1/16
resolution (a few minutes per variant on 2 cores; the table is in
``docs/investigations/2026-11-30-fruit-failure.md``).

Prints one row per variant: mean per-image held-out PSNR / SSIM (``models/metrics.py``), the
training-batch PSNR of the last steps, the gap between the two, and the constant-colour baseline (the
held-out PSNR of predicting the mean training colour everywhere), and writes ``capture_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

_SMALL_HASH = [
    "model.net.field.encoding.n_levels=8",
    "model.net.field.encoding.log2_hashmap_size=15",
    "model.net.field.encoding.max_resolution=512",
]
#: the fruit failure on a CPU: 1/16 resolution, 512 rays per step, 32^3 occupancy grid, step 0.03,
#: cone 1/16, at most 64 samples per ray; the hash grid is left to the variants
CPU_REPRO = [
    "accelerator=cpu",
    "data.downscale=16",
    "data.batch_size=512",
    "model.net.step.sample_budget=null",
    "model.net.backend=torch",
    "model.net.renderer.occupancy.resolution=32",
    "model.net.renderer.step_size=0.03",
    "model.net.renderer.large_scene_cone_angle=0.0625",
    "model.net.renderer.max_samples_per_ray=64",
]
_COARSE_MARCH = [
    "model.net.renderer.step_size=0.0067658",
    "model.net.renderer.large_scene_cone_angle=0.015625",
    "model.net.renderer.max_samples_per_ray=256",
    "model.net.renderer.occupancy.resolution=64",
    "model.net.renderer.occupancy.warmup_steps=64",
]
#: name -> overrides. Each isolates one candidate cause. On a CPU at 1/16 resolution the fruit capture
#: fails with the default hash grid and reconstructs with ``small_hash`` (README); ``res_512``,
#: ``table_15`` and ``levels_8`` take its three changes one at a time (``table_15`` and ``levels_8``
#: each reconstruct, ``res_512`` fails worse; ``res_64`` is the finest level at ~2 cells per pixel
#: footprint at 1/16 resolution, ``base_512`` the coarsest level at 16 per unit cube instead of 16 over
#: the box). ``cpu_recipe`` is the model and marching of ``experiment=cpu``.
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "cpu_recipe": [*_SMALL_HASH, *_COARSE_MARCH, "data.batch_size=2048"],
    "small_hash": _SMALL_HASH,
    # the three halves of small_hash, one at a time
    "res_512": ["model.net.field.encoding.max_resolution=512"],
    "table_15": ["model.net.field.encoding.log2_hashmap_size=15"],
    "levels_8": ["model.net.field.encoding.n_levels=8"],
    "res_64": ["model.net.field.encoding.max_resolution=64"],
    "base_512": ["model.net.field.encoding.base_resolution=512"],
    "coarse_march": _COARSE_MARCH,
    "downscale_4": ["data.downscale=4"],
    # samples start 0.2 (NGP units) from the camera: no per-view floaters right in front of a camera
    "near_0.2": ["++model.net.renderer.near_plane=0.2"],
    # smaller outer box: less space behind the scene where one view's rays pass alone
    "aabb_2": ["data.aabb_scale=2"],
    # instant-ngp's initial density (exp(x) with x ~ 0, i.e. sigma ~ 1) instead of exp(x - 1)
    "bias_0": ["model.net.field.density_bias=0.0"],
    # every op on the PyTorch reference (the test oracle): rules the CUDA kernels in or out (slow)
    "torch_ops": ["model.net.backend=torch"],
}
DEFAULT_VARIANTS = "baseline,small_hash,res_512,table_15,levels_8"


def constant_colour_psnr(datamodule: Any) -> float:
    """Mean per-image PSNR of predicting the mean training colour at every held-out pixel."""
    mean = datamodule.train_set.pixels[:, :3].float().mean(0) / 255.0
    psnrs = []
    for v in range(len(datamodule.test_set.frames)):
        b = datamodule.test_batch(v)
        mse = ((b["rgb"] - mean.to(b["rgb"].device)) ** 2).mean()
        psnrs.append(-10.0 * math.log10(max(float(mse), 1e-10)))
    return sum(psnrs) / len(psnrs)


def run_variant(path: str, overrides: list[str], steps: int, seed: int, out_dir: Path) -> dict[str, float]:
    """Train one variant for ``steps`` steps with Lightning (no logger, no checkpoints); evaluate it."""
    import lightning as L
    import torch

    from nerf_lightning.apps.train import build_datamodule, build_model
    from nerf_lightning.run.config import compose_train_config

    cfg = compose_train_config(
        [f"data.path={path}", "logger=none", "callbacks=none", f"seed={seed}", *overrides], out_dir
    )
    L.seed_everything(seed, workers=True)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    model, _ = build_model(cfg, dm)  # as the train app builds it: the capture's box, views, batch rule
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        check_val_every_n_epoch=10**6,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
        default_root_dir=str(out_dir),
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    train_s = time.perf_counter() - start
    train_psnr = float(trainer.callback_metrics.get("train/psnr", torch.tensor(float("nan"))))
    trainer.test(model, datamodule=dm, verbose=False)
    result = model.eval_results["test"]
    return {
        "heldout_psnr": float(result["psnr"]),
        "heldout_ssim": float(result["ssim"]),
        # instant-ngp's run.py metric (over black): shows leftover opacity where the views are empty
        "heldout_psnr_ngp": float(result["psnr_ngp"]) if "psnr_ngp" in result else float("nan"),
        "train_psnr": train_psnr,
        "constant_psnr": constant_colour_psnr(dm),
        "views": int(result["views"].numel()),
        "optimizer_steps": int(trainer.global_step),  # steps counts reference steps under a rule in rays
        "train_s": train_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, help="capture folder")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {sorted(VARIANTS)}")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='NAME="OVERRIDES"',
        help="extra variant (repeatable)",
    )
    ap.add_argument("--common", default="", help="overrides added to every variant, e.g. data.downscale=2")
    ap.add_argument(
        "--cpu-repro", action="store_true", help="add CPU_REPRO (the fruit failure on a CPU) to each variant"
    )
    ap.add_argument("--out", type=Path, default=Path("capture_ab.json"))
    args = ap.parse_args(argv)
    variants = {}
    for name in filter(None, args.variants.split(",")):
        if name not in VARIANTS:
            ap.error(f"unknown variant {name!r}; known: {sorted(VARIANTS)}")
        variants[name] = VARIANTS[name]
    for spec in args.variant:
        name, _, overrides = spec.partition("=")
        variants[name] = shlex.split(overrides)
    common = [*(CPU_REPRO if args.cpu_repro else []), *shlex.split(args.common)]
    warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
    for name in ("lightning.pytorch", "lightning.fabric"):  # device and tip chatter, once per variant
        logging.getLogger(name).setLevel(logging.WARNING)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="capture_ab_") as tmp:
        for name, overrides in variants.items():
            rows[name] = run_variant(
                args.path, [*common, *overrides], args.steps, args.seed, Path(tmp) / name
            )
            r = rows[name]
            print(
                f"{name:12s} held-out {r['heldout_psnr']:6.2f} dB (ssim {r['heldout_ssim']:.3f}, "
                f"run.py {r['heldout_psnr_ngp']:6.2f} dB)  "
                f"train {r['train_psnr']:6.2f} dB  gap {r['train_psnr'] - r['heldout_psnr']:5.1f}  "
                f"constant-colour {r['constant_psnr']:5.2f} dB  {r['train_s']:5.0f} s",
                flush=True,
            )
    args.out.write_text(
        json.dumps({"path": args.path, "steps": args.steps, "variants": variants, "rows": rows})
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
