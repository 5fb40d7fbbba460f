"""Learned poses on the embedded synthetic scene with known damage, on a CPU: one JSON line per run.

The evidence of docs/investigations/2026-12-05-learned-poses.md: each run trains the CPU-sized model of
``tests/models/tiny_training.py`` on the scene (undamaged, or with ``data/synthetic/damage.py``'s pose
damage) with or without ``model.camera_opt``, then reports the pose errors against the truth (mean
rotation in degrees, mean centre error in NGP units, and both as a fraction of the damage), the
training PSNR (training views rendered with their learned corrections) and the held-out PSNR (plain
and under the fair protocol).

    PYTHONPATH=src:. python benchmarks/pose_recovery_cpu.py --damage poses --camera on --steps 300
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.spatial.transform import Rotation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models.tiny_training import train_tiny, validate  # noqa: E402

from nerf_lightning.data.formats import load_capture  # noqa: E402
from nerf_lightning.data.synthetic import generate_scene  # noqa: E402
from nerf_lightning.data.synthetic.damage import damage_poses  # noqa: E402
from nerf_lightning.models.camera_opt import CameraOptimizer, gauge_basis  # noqa: E402


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(a @ b.T) - 1) / 2))))


def pose_errors(truth: np.ndarray, poses: np.ndarray) -> tuple[float, float]:
    """Mean rotation error (degrees) and mean centre error (NGP units) of ``poses`` [V, 3, 4] against
    ``truth`` [V, 3, 4]."""
    rot = np.mean([_angle_deg(t[:, :3], p[:, :3]) for t, p in zip(truth, poses, strict=True)])
    trans = float(np.linalg.norm(truth[:, :, 3] - poses[:, :, 3], axis=-1).mean())
    return float(rot), trans


def aligned_errors(truth: np.ndarray, poses: np.ndarray) -> tuple[float, float]:
    """:func:`pose_errors` up to a global similarity: the per-view residual corrections (``camera_opt``'s
    layout) with their best-fitting global similarity removed (``gauge_basis``, first order), which no
    training signal can determine."""
    w = np.stack(
        [Rotation.from_matrix(t[:, :3] @ p[:, :3].T).as_rotvec() for t, p in zip(truth, poses, strict=True)]
    )
    x = np.concatenate([w, truth[:, :, 3] - poses[:, :, 3]], axis=1)
    basis = gauge_basis(poses[:, :, 3])
    x = x - (basis * (basis * x[:, :, None]).sum(axis=(0, 1))).sum(-1)
    return float(np.degrees(np.linalg.norm(x[:, :3], axis=1)).mean()), float(
        np.linalg.norm(x[:, 3:], axis=1).mean()
    )


def reprojection_px(truth: np.ndarray, poses: np.ndarray, focal_px: float) -> float:
    """Mean image distance (pixels) between where the cameras ``truth`` and ``poses`` [V, 3, 4] (NGP space,
    looking down -z) see 27 points of the scene's middle, ``[0.35, 0.65]^3`` (around the object): what the
    images can tell of a pose error, whatever its split into rotation and translation."""
    g = np.linspace(0.35, 0.65, 3)
    points = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)

    def project(c2w: np.ndarray) -> np.ndarray:
        cam = (points - c2w[:, 3]) @ c2w[:, :3]  # R^T (p - t)
        return focal_px * cam[:, :2] / -cam[:, 2:3]

    return float(
        np.mean(
            [
                np.linalg.norm(project(t) - project(p), axis=-1).mean()
                for t, p in zip(truth, poses, strict=True)
            ]
        )
    )


def _with_group(
    factory: Any,
    eps: float | None = None,
    beta2: float | None = None,
    every: int = 1,
    ngp_schedule: bool = False,
    **kwargs: Any,
) -> CameraOptimizer:
    """The camera optimizer of ``factory(**kwargs)`` with its optimizer group changed: Adam's ``eps`` and
    ``beta2`` (None: the optimizer's), one update every ``every`` training steps with the gradient
    averaged over them (instant-ngp's ``n_steps_between_cam_updates``), and with ``ngp_schedule``
    instant-ngp's rate ``lr * 0.33 ** (update // 128)``, floored at the main rate (1e-2) / 1000,
    instead of the camera optimizer's own schedule."""
    camera = factory(**kwargs)
    group_of = camera.parameter_group
    overrides: dict[str, Any] = {}
    if eps is not None:
        overrides["eps"] = eps
    if beta2 is not None:
        overrides["betas"] = (0.9, beta2)

    def parameter_group(total_steps: int) -> Any:
        group = group_of(total_steps)
        as_dict = group.as_dict
        group.as_dict = lambda: {**as_dict(), **overrides}
        if ngp_schedule:  # the factor at training step s; the camera update it takes is s // every
            floor = 1e-5 / camera.lr
            group.lr_lambda = lambda step: max(0.33 ** (step // every // 128), floor)
        return group

    camera.parameter_group = parameter_group
    if every > 1:
        state: dict[str, Any] = {"sum": None, "n": 0}

        def accumulate(p: torch.Tensor) -> None:  # after each backward has written p.grad
            state["sum"] = p.grad.clone() if state["sum"] is None else state["sum"] + p.grad
            state["n"] += 1
            if state["n"] % every:
                p.grad = None  # Adam skips a parameter without a gradient (its step count too)
            else:
                p.grad, state["sum"] = state["sum"] / every, None

        camera.adjustment.register_post_accumulate_grad_hook(accumulate)
    return camera


def run(args: argparse.Namespace, scene: Path, work: Path) -> dict[str, Any]:
    path = damage_poses(scene, work / "damaged", seed=args.damage_seed) if args.damage == "poses" else scene
    components: dict[str, Any] = {}
    if args.camera == "on":
        components["camera_opt"] = functools.partial(
            CameraOptimizer, enabled=True, lr=args.lr, lr_final=args.lr_final, decay_steps=args.decay,
            warmup_steps=args.warmup, gauge=args.gauge, weight_decay=args.weight_decay,
        )  # fmt: skip
        components["camera_opt"] = functools.partial(
            _with_group, components["camera_opt"], eps=args.eps, beta2=args.beta2, every=args.cam_every,
            ngp_schedule=args.ngp_schedule,
        )  # fmt: skip
    # the fair held-out protocol in the held-out validation below only with --fit (slow)
    components["heldout_fit"] = {"enabled": args.fit}
    start = time.perf_counter()
    model, dm = train_tiny(path, args.steps, rays=args.rays, seed=args.seed, **components)
    seconds = time.perf_counter() - start
    truth = np.stack([f.c2w[:3, :4] for f in load_capture(scene).train])
    given = dm.train_poses.double().numpy()
    refined = given if model.camera_opt is None else model.camera_opt.refined_poses(dm.train_poses).numpy()
    rot0, trans0 = pose_errors(truth, given)
    rot, trans = pose_errors(truth, refined)
    out: dict[str, Any] = {**vars(args), "train_s": round(seconds, 1)}
    out.update(rot_before=rot0, rot_after=rot, trans_before=trans0, trans_after=trans)
    focal = float(load_capture(scene).train[0].intrinsics.fx)
    out.update(
        reproj_px_before=reprojection_px(truth, given, focal),
        reproj_px=reprojection_px(truth, refined, focal),
    )
    if rot0 > 0:
        out.update(rot_ratio=rot / rot0, trans_ratio=trans / trans0)
        rot_a, trans_a = aligned_errors(truth, refined)
        rot0_a, trans0_a = aligned_errors(truth, given)
        out.update(
            rot_aligned_before=rot0_a, rot_aligned=rot_a, trans_aligned_before=trans0_a, trans_aligned=trans_a
        )
    if model.camera_opt is not None:
        state = model.trainer.optimizers[0].state[model.camera_opt.adjustment]
        out["adam_sqrt_v_median"] = float(state["exp_avg_sq"].sqrt().median())
        out["adam_sqrt_v_min"] = float(state["exp_avg_sq"].sqrt().min())
    if model.camera_opt is not None:
        group = [g for g in model.trainer.optimizers[0].param_groups if g.get("name") == "camera_opt"][0]
        out.update(camera_eps=group.get("eps"), camera_betas=group.get("betas"), camera_lr_last=group["lr"])
        out["camera_updates"] = int(state["step"])
    out["train_psnr"] = validate(model, path, split="train")["val/psnr"]
    held = validate(model, path)
    out["heldout_psnr"] = held["val/psnr"]
    out["heldout_psnr_fitted"] = held.get("val/psnr_fitted")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--damage", choices=("none", "poses"), default="poses")
    parser.add_argument("--camera", choices=("off", "on"), default="on")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rays", type=int, default=512, help="rays per step")
    parser.add_argument("--damage-seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--lr-final", type=float, default=3e-4)
    parser.add_argument("--decay", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--gauge", choices=("similarity", "none"), default="similarity")
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument(
        "--eps", type=float, default=None, help="Adam eps of the pose group (default: its own)"
    )
    parser.add_argument("--beta2", type=float, default=None, help="Adam beta2 of the pose group")
    parser.add_argument(
        "--cam-every", type=int, default=1, help="one pose update every K steps, on the mean gradient"
    )
    parser.add_argument(
        "--ngp-schedule", action="store_true", help="pose lr: --lr * 0.33 ** (update // 128), as instant-ngp"
    )
    parser.add_argument("--fit", action="store_true", help="also the fair held-out protocol (slow)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/pose_recovery_cpu"))
    args = parser.parse_args(argv)
    work = args.work
    scene = work / "scene"
    if not (scene / "transforms.json").exists():
        scene = generate_scene(scene, n_views=24, width=32, height=32, supersample=2).parent
    torch.set_num_threads(1)
    result = run(args, scene, work / f"run_{time.time_ns()}")
    print(json.dumps({k: (str(v) if isinstance(v, Path) else v) for k, v in result.items()}), flush=True)
    return result


if __name__ == "__main__":
    main()
