#!/usr/bin/env python3
"""instant-ngp (pyngp, headless) on Blender-layout split files: train, then score the test views.

Run by ``benchmarks/peers.py`` as a plain script with the Python that pyngp was built for; it imports
nothing of this project (pyngp must be imported before numpy, and no second CUDA runtime may load:
both crash pyngp's loader). One call trains one fresh network on ``--train`` for ``--seconds`` of
wall time (the clock starts after the first frame, which builds the network and, with JIT fusion,
compiles its kernels; image loading is not timed either) or ``--n_steps`` steps, then evaluates the
views of ``--test`` exactly as instant-ngp's ``scripts/run.py --test_transforms`` does:

- the test file is loaded as the testbed's dataset (``load_training_data``); its ``aabb_scale`` must
  equal the training file's: instant-ngp resets the network when it changes, and the run fails here
  instead of scoring a fresh network;
- background ``[0, 0, 0, 1]``, ``snap_to_pixel_centers``, 8 samples per pixel,
  ``render_min_transmittance`` 1e-4, lens distortion applied, the camera set to each test view;
- ``psnr_black`` (run.py's metric): the ground truth rendered by the testbed from the test image
  (``render_ground_truth``: the image over black in linear RGB), both linear -> sRGB, clipped to
  [0, 1], MSE over pixels and channels, PSNR per image, mean over the images;
- ``psnr_srgb_white``: the prediction's straight colour in sRGB composited over white in sRGB against
  the image file's RGBA composited the same way (the convention of nerfacc and nerf_lightning);
- ``psnr_linear_white``: as ``psnr_black`` with the testbed's background white (``[1, 1, 1, 1]``): the
  prediction and the ground truth both composited over white in *linear* RGB by instant-ngp itself, then
  linear -> sRGB. instant-ngp trains in linear RGB over random backgrounds, so this is its own reading
  of "over white"; it differs from ``psnr_srgb_white`` only at partly transparent pixels.

``--train-extrinsics`` turns on instant-ngp's extrinsics optimization during training
(``testbed.nerf.training.optimize_extrinsics``; off by default in instant-ngp). The test cameras are
scored as the file gives them, as run.py means to: loading the test file resizes the per-view pose
offsets (``std::vector::resize`` in ``load_nerf_post``), which keeps the offsets learned for the first
training views and applies them to the test views of the same index. run.py scores those shifted
cameras; this driver first sets every training view's camera to its refined pose
(``set_camera_extrinsics(i, get_camera_extrinsics(i))``, which zeroes its offset and exposure state),
so the test views start from zero offsets.

Output: one JSON line appended to ``--out``: tag, seconds/steps trained, steps/s, both means and
minima, and ``per_view`` (image path and both PSNRs of every test view, in the dataset's order).
"""

import argparse
import ctypes
import glob
import json
import os
import re
import sys
import time

np = None  # imported after pyngp (importing numpy first crashes pyngp's image loader)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="transforms_train.json (a file: a folder loads every json)")
    p.add_argument("--test", required=True, help="transforms_test.json")
    p.add_argument("--seconds", type=float, default=0.0, help="wall seconds of training after the 1st frame")
    p.add_argument("--n_steps", type=int, default=0, help="or: training steps")
    p.add_argument("--root", required=True, help="instant-ngp folder (configs/, build/pyngp*.so)")
    p.add_argument("--jit", choices=["off", "on", "default"], default="default", help="tcnn JIT fusion")
    p.add_argument("--train-extrinsics", action="store_true", help="optimize the training cameras' poses")
    p.add_argument("--spp", type=int, default=8)
    p.add_argument("--out", required=True, help="JSON-lines file the result is appended to")
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def linear_to_srgb(x):
    return np.where(x > 0.0031308, 1.055 * np.maximum(x, 0.0) ** (1.0 / 2.4) - 0.055, 12.92 * x)


def psnr(a, b):
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    mse = float(np.mean((np.maximum(a, 0.0) - b) ** 2))
    return -10.0 * np.log10(max(mse, 1e-12))


def natural_key(path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def cuda_sync():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            ctypes.CDLL(name).cudaDeviceSynchronize()
            return
        except OSError:
            continue


def load_rgba(path):
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.float32) / 255.0


def set_jit(testbed, mode, res):
    if mode == "default":
        return
    try:
        testbed.jit_fusion = mode == "on"
    except Exception as err:  # noqa: BLE001 - a build without RTC has no JIT fusion
        res["jit_error"] = str(err)


def train(testbed, a, res):
    testbed.shall_train = True
    if a.train_extrinsics:
        testbed.nerf.training.optimize_extrinsics = True
    t_first = time.monotonic()
    set_jit(testbed, a.jit, res)
    testbed.frame()  # builds the network (JIT: compiles its kernels); not timed
    set_jit(testbed, a.jit, res)
    cuda_sync()
    res["first_frame_s"] = time.monotonic() - t_first
    step0 = testbed.training_step
    n_steps = a.n_steps if a.seconds <= 0 and a.n_steps > 0 else 0
    t0 = time.monotonic()
    deadline = t0 + a.seconds if a.seconds > 0 else None
    while testbed.frame():
        if deadline is not None and time.monotonic() >= deadline:
            break
        if n_steps and testbed.training_step >= n_steps:
            break
    cuda_sync()
    res["train_s"] = time.monotonic() - t0
    res["steps"] = int(testbed.training_step)
    res["steps_per_s"] = (testbed.training_step - step0) / max(res["train_s"], 1e-9)
    res["loss"] = float(testbed.loss)


def clear_view_offsets(testbed):
    """Bake each training view's learned pose offset into its pose and zero the offset (see above)."""
    training = testbed.nerf.training
    for i in range(training.dataset.n_images):
        training.set_camera_extrinsics(i, training.get_camera_extrinsics(i), True)


def evaluate(testbed, a, res):
    if a.train_extrinsics:
        clear_view_offsets(testbed)
    train_aabb = int(testbed.nerf.training.dataset.aabb_scale)
    testbed.background_color = [0.0, 0.0, 0.0, 1.0]
    testbed.snap_to_pixel_centers = True
    testbed.nerf.render_min_transmittance = 1e-4
    testbed.shall_train = False
    testbed.load_training_data(a.test)
    testbed.render_with_lens_distortion = True
    res["aabb_scale"] = train_aabb
    if int(testbed.nerf.training.dataset.aabb_scale) != train_aabb:
        raise SystemExit(
            f"error: {a.test}: aabb_scale {testbed.nerf.training.dataset.aabb_scale} differs from the "
            f"training file's {train_aabb}: instant-ngp would score a reset network"
        )
    dataset = testbed.nerf.training.dataset
    n = dataset.n_images
    try:  # the loader natural-sorts the frames by file_path: take its order
        paths = [str(p) for p in dataset.paths]
    except Exception:  # noqa: BLE001
        paths = []
    if len(paths) != n:
        with open(a.test) as f:
            paths = sorted((fr["file_path"] for fr in json.load(f)["frames"]), key=natural_key)
    test_dir = os.path.dirname(os.path.realpath(a.test))
    per_view = []
    for i in range(n):
        w, h = (int(v) for v in dataset.metadata[i].resolution)
        testbed.set_camera_to_training_view(i)
        testbed.background_color = [0.0, 0.0, 0.0, 1.0]
        testbed.render_ground_truth = True
        ref = testbed.render(w, h, 1, True)
        testbed.render_ground_truth = False
        black = testbed.render(w, h, a.spp, True)
        testbed.background_color = [0.0, 0.0, 0.0, 0.0]
        alpha = np.clip(testbed.render(w, h, a.spp, True)[..., 3:4], 0.0, 1.0)
        pred = np.clip(linear_to_srgb(black[..., :3]), 0.0, 1.0)
        gt = np.clip(linear_to_srgb(ref[..., :3]), 0.0, 1.0)
        straight = np.divide(black[..., :3], alpha, out=np.zeros_like(black[..., :3]), where=alpha > 1e-6)
        pred_white = np.clip(linear_to_srgb(np.clip(straight, 0.0, 1.0)) * alpha + (1.0 - alpha), 0.0, 1.0)
        testbed.background_color = [1.0, 1.0, 1.0, 1.0]
        testbed.render_ground_truth = True
        ref_lin_white = np.clip(linear_to_srgb(testbed.render(w, h, 1, True)[..., :3]), 0.0, 1.0)
        testbed.render_ground_truth = False
        pred_lin_white = np.clip(linear_to_srgb(testbed.render(w, h, a.spp, True)[..., :3]), 0.0, 1.0)
        path = paths[i] if os.path.isabs(paths[i]) else os.path.join(test_dir, paths[i])
        rgba = load_rgba(path)
        if rgba.shape[:2] != pred.shape[:2]:
            raise SystemExit(f"error: {path}: image {rgba.shape[:2]} but the render is {pred.shape[:2]}")
        gt_white = rgba[..., :3] * rgba[..., 3:4] + (1.0 - rgba[..., 3:4])
        per_view.append(
            {
                "image": paths[i],
                "psnr_black": psnr(pred, gt),
                "psnr_srgb_white": psnr(pred_white, gt_white),
                "psnr_linear_white": psnr(pred_lin_white, ref_lin_white),
            }
        )
    res["n_test"] = n
    res["per_view"] = per_view
    for key in ("psnr_black", "psnr_srgb_white", "psnr_linear_white"):
        values = [v[key] for v in per_view]
        res[key] = float(np.mean(values))
        res[key + "_min"] = float(np.min(values))


def main(argv=None):
    a = parse_args(argv)
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]  # not this package's modules
    root = os.path.realpath(a.root)
    sys.path[:0] = [os.path.join(root, "build")] + [
        os.path.dirname(p) for p in glob.glob(os.path.join(root, "build*", "**", "pyngp*.so"), recursive=True)
    ]
    import pyngp as ngp  # before numpy, see above

    global np
    import numpy

    np = numpy
    res = {"tag": a.tag, "seconds_target": a.seconds, "n_steps_target": a.n_steps}
    res["train_extrinsics"] = a.train_extrinsics
    t_load = time.monotonic()
    testbed = ngp.Testbed()
    testbed.root_dir = root
    testbed.load_training_data(a.train)
    res["load_s"] = time.monotonic() - t_load
    train(testbed, a, res)
    t_eval = time.monotonic()
    evaluate(testbed, a, res)
    res["eval_s"] = time.monotonic() - t_eval
    line = json.dumps(res)
    print("RESULT " + line, flush=True)
    print(
        f"PSNR black (run.py) {res['psnr_black']:.3f} [min {res['psnr_black_min']:.3f}]  "
        f"sRGB/white {res['psnr_srgb_white']:.3f}  linear/white {res['psnr_linear_white']:.3f}"
    )
    with open(a.out, "a") as f:
        f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
