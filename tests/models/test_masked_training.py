"""Masks of what moved, measured: an occluder that moves between views, in a third of the training views.

The generated scene (24 views of 32 x 32; every 8th held out) is trained with the CPU preset's
pipeline (``tiny_training``, 300 steps): on the clean views; with an opaque red disc painted into 7 of
its 21 training views, at another place in each (what walked through the shot); and with the same disc
and instant-ngp ``dynamic_mask_*.png`` masks marking it. The held-out views never show the disc. With
the masks the held-out PSNR is within 0.5 dB of the clean run's; without them the field learns red
floaters and is clearly lower.

One 300-step run of this size varies by up to 0.7 dB with its seed (masked runs, seeds 0-3: 20.36,
21.09, 21.01, 20.98 dB; clean: 21.09, 21.04, 21.09, 20.84), so the clean and masked numbers are the
means of seeds 0 and 1. Measured on a 2-core CPU (2026-12-07): clean 21.07 dB, masked 20.72 dB (0.34
below), unmasked 19.22 dB (1.85 below). ``repro``: five trainings, about three minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from models.tiny_training import train_tiny, validate
from nerf_lightning.data.synthetic import generate_scene

pytestmark = pytest.mark.repro
STEPS = 300
SIZE = 32
RADIUS = 7  # pixels: about 15 % of each occluded view
#: the margin the masked run must keep to the clean one, and how far below the unmasked run must stay
MASKED_WITHIN_DB = 0.5
UNMASKED_BELOW_DB = 1.0
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("occluder")
    clean = generate_scene(root / "clean", n_views=24, width=SIZE, height=SIZE, supersample=2).parent
    frames = json.loads((clean / "transforms.json").read_text())["frames"]
    training = [i for i in range(len(frames)) if i % 8 != 0]  # the loader holds out every 8th view
    occluded = training[::3]  # a third of the training views
    out = {"clean": clean}
    for name, masked in (("unmasked", False), ("masked", True)):
        copy = root / name
        shutil.copytree(clean, copy, ignore=shutil.ignore_patterns("cache"))
        for k, i in enumerate(occluded):
            path = copy / frames[i]["file_path"]
            image = iio.imread(path)
            yy, xx = np.mgrid[:SIZE, :SIZE]
            cx, cy = 8 + (k * 5) % 17, 9 + (k * 7) % 15  # it moves between the views
            disc = (xx - cx) ** 2 + (yy - cy) ** 2 <= RADIUS**2
            image[disc] = (230, 20, 20, 255)
            iio.imwrite(path, image)
            if masked:  # instant-ngp's convention: nonzero = ignore
                iio.imwrite(
                    path.parent / f"dynamic_mask_{path.stem}.png", np.where(disc, 255, 0).astype(np.uint8)
                )
        out[name] = copy
    return out


def test_masks_train_as_if_the_occluder_had_never_been_there(scenes: dict[str, Path]) -> None:
    psnr = {}
    for name, path in scenes.items():
        runs = []
        for seed in SEEDS if name != "unmasked" else SEEDS[:1]:  # the unmasked gap is far above the noise
            model, dm = train_tiny(path, STEPS, seed=seed)
            assert (dm.sampler.kept is not None) == (name == "masked")
            runs.append(validate(model, path)["val/psnr"])
        psnr[name] = float(np.mean(runs))
    print("held-out PSNR:", {k: round(v, 2) for k, v in psnr.items()})
    assert abs(psnr["masked"] - psnr["clean"]) < MASKED_WITHIN_DB, psnr
    assert psnr["unmasked"] < psnr["clean"] - UNMASKED_BELOW_DB, psnr
