"""NeRFDataModule: device batches built from a generated capture.

The wiring is checked against sources the data path does not use: target colours against the PNGs
decoded with imageio, rays against the synthetic generator's own (numpy, float64) camera model in
world coordinates. The images are not square (24 x 20), so a transposed index or swapped axis shows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.synthetic import generate_scene, project
from tests.ray_batches import present_fields

W, H = 24, 20


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distorted (OpenCV k1 k2 p1 p2) capture: training rays come from the undistortion table."""
    out = tmp_path_factory.mktemp("dm") / "scene"
    generate_scene(out, n_views=16, width=W, height=H, supersample=1, distortion=True)
    return out


def _decoded_pixels(dm: NeRFDataModule, split: str, view_ids: torch.Tensor, ix, iy) -> np.ndarray:
    """RGBA in [0, 1] of pixel column ``ix``, row ``iy`` of each ray's image, decoded with imageio."""
    frames = (dm.train_set if split == "train" else dm.val_set).frames
    images = {int(v): iio.imread(frames[int(v)].image_path) for v in view_ids.unique()}
    for img in images.values():
        assert img.shape == (H, W, 4)
    rgba = [images[int(v)][int(y), int(x)] for v, x, y in zip(view_ids, ix, iy, strict=True)]
    return np.stack(rgba).astype(np.float64) / 255.0


#: how far a ray may miss its pixel, in pixels: the undistortion table interpolates between pixel
#: corners (error ~ (corner spacing / focal)^2: up to 4e-3 px on these 26 px-focal strongly distorted
#: toy images, < 1e-4 px on real captures); exact rays (pinhole) are float32-accurate.
TOLERANCE_PX = {True: 5e-3, False: 1e-4}


def _assert_rays_land_in_their_pixels(scene: Path, dm: NeRFDataModule, split: str, batch: dict) -> np.ndarray:
    """Project a point of every ray back with the generator's camera (world space, its own float64 lens
    model); returns the sub-pixel positions (u - ix, v - iy), each within [0, 1] up to TOLERANCE_PX."""
    doc = json.loads((scene / "transforms.json").read_text())
    meta = {Path(f["file_path"]).name: f for f in doc["frames"]}
    frames = (dm.train_set if split == "train" else dm.val_set).frames
    offset, scale = np.asarray(doc["offset"]), doc["scale"]
    # NGP -> world: NGP axes are the world's (y, z, x), scaled by `scale` and shifted by `offset`
    o_ngp, d_ngp = batch["rays_o"].double().numpy(), batch["rays_d"].double().numpy()
    points = (o_ngp[:, [2, 0, 1]] - offset) / scale + 0.7 * d_ngp[:, [2, 0, 1]]
    view_ids, ix, iy = batch["view_ids"].numpy(), batch["px"].numpy(), batch["py"].numpy()
    frac = np.empty((len(view_ids), 2))
    for v in np.unique(view_ids):
        f = meta[Path(frames[v].image_path).name]
        sel = view_ids == v
        u, w = project(
            points[sel],
            np.asarray(f["transform_matrix"]),
            doc["fl_x"],
            doc["fl_y"],
            doc["cx"],
            doc["cy"],
            doc["k1"],
            doc["k2"],
            doc["p1"],
            doc["p2"],
        )
        frac[sel] = np.stack([u - ix[sel], w - iy[sel]], axis=1)
    tol = TOLERANCE_PX[dm.train_set.undistortion.enabled]
    assert frac.min() > -tol and frac.max() < 1 + tol, (frac.min(), frac.max())
    return frac


@pytest.mark.parametrize("capture", ["scene", "pinhole_scene"])
def test_train_batch_targets_and_rays(capture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    scene = request.getfixturevalue(capture)
    # the photograph recipe spelled out: these RGBA renders would train through the pixel centres
    dm = NeRFDataModule(path=str(scene), batch_size=512, cache_dir=str(tmp_path / "cache"), pixel_jitter=True)
    dm.setup("fit")
    n_views = 16 if capture == "scene" else 9
    assert len(dm.train_set.frames) == n_views - len(range(0, n_views, 8))  # every 8th held out
    assert dm.train_set.undistortion.enabled == (capture == "scene")
    dm.ensure_device(torch.device("cpu"))
    dm.feedback.alpha_targets = True  # as a model with model.net.loss.alpha_weight > 0 says it reads
    torch.manual_seed(0)
    b = present_fields(dm.train_batch(512))
    assert b["rays_o"].shape == (512, 3) and b["rgb"].shape == (512, 3)
    assert b["view_ids"].unique().numel() == len(dm.train_set.frames)  # every view drawn
    assert b["px"].max() == W - 1 and b["py"].max() == H - 1  # both sides of the image drawn to the edge
    torch.testing.assert_close(b["rays_d"].norm(dim=-1), torch.ones(512))
    # targets are the decoded pixels at [iy, ix], composited over the batch's random background
    rgba = _decoded_pixels(dm, "train", b["view_ids"], b["px"], b["py"])
    alpha = rgba[:, 3:]
    expected = rgba[:, :3] * alpha + b["background"].double().numpy() * (1 - alpha)
    np.testing.assert_allclose(b["rgb"].double().numpy(), expected, rtol=0, atol=1e-6)
    assert (alpha < 1).any() and (alpha > 0).any()  # both object and background pixels drawn
    # the pixels' own alpha, the target of model.net.loss.alpha_weight's opacity loss
    np.testing.assert_allclose(b["alpha"].double().numpy(), alpha[:, 0], rtol=0, atol=1e-6)
    # every ray goes through its own pixel, at a random position inside it (area-averaged targets)
    frac = _assert_rays_land_in_their_pixels(scene, dm, "train", b)
    assert frac.std(axis=0).min() > 0.2  # spread over the pixel, not through one fixed point


def _batch_with_seed(path: Path, tmp_path: Path, n: int = 128, **recipe) -> tuple[NeRFDataModule, dict]:
    dm = NeRFDataModule(path=str(path), batch_size=n, cache_dir=str(tmp_path / "cache"), **recipe)
    dm.setup("fit")
    dm.ensure_device(torch.device("cpu"))
    torch.manual_seed(7)
    return dm, present_fields(dm.train_batch(n))


def test_pixel_centres_over_random_backgrounds(scene: Path, tmp_path: Path) -> None:
    """``data.pixel_jitter=false`` (nerfacc's lego recipe): training rays through the pixel centres; the
    targets composited over a random colour per ray, as every training ray (the evaluation background,
    white, lost on lego's published protocol: docs/benchmarks/2026-12-07.md)."""
    dm, b = _batch_with_seed(scene, tmp_path, n=256, pixel_jitter=False)
    bg = b["background"].double().numpy()
    assert bg.shape == (256, 3) and 0.0 <= bg.min() and bg.max() < 1.0
    assert bg.std(axis=0).min() > 0.2  # a colour per ray, spread over [0, 1): not one fixed colour
    rgba = _decoded_pixels(dm, "train", b["view_ids"], b["px"], b["py"])
    expected = rgba[:, :3] * rgba[:, 3:] + bg * (1 - rgba[:, 3:])
    np.testing.assert_allclose(b["rgb"].double().numpy(), expected, rtol=0, atol=1e-6)
    assert (rgba[:, 3] < 1).any()  # background pixels are in the batch
    frac = _assert_rays_land_in_their_pixels(scene, dm, "train", b)
    np.testing.assert_allclose(frac, 0.5, rtol=0, atol=TOLERANCE_PX[True])


RENDER_RECIPE = dict(pixel_jitter=False)
PHOTO_RECIPE = dict(pixel_jitter=True)


@pytest.mark.parametrize(
    ("capture", "kind"),
    [("scene", "render"),  # RGBA renders over a transparent background, instant-ngp transforms.json
     ("blender_capture", "render"),  # RGBA, Blender split files
     ("blender_photos", "photo"),  # opaque RGB photographs, Blender split files (fl_x, k1..p2)
     ("phone_capture", "photo"),  # the same photographs, instant-ngp transforms.json
     ("opaque_rgba_capture", "photo")],  # RGBA files whose alpha is 255 everywhere
)
def test_auto_recipe_follows_the_images_not_the_layout(
    capture: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``auto`` (the default): renders (RGBA over a transparent background) train through the pixel
    centres, photographs (opaque images) through random points of their pixels, in whichever file
    layout. The batch equals the one drawn with the recipe spelled out, and differs from the other
    recipe's; setup logs the choice and its reason."""
    path = request.getfixturevalue(capture)
    with caplog.at_level(logging.INFO, logger="nerf_lightning.data"):
        dm, auto = _batch_with_seed(path, tmp_path)
    expected, other = (RENDER_RECIPE, PHOTO_RECIPE) if kind == "render" else (PHOTO_RECIPE, RENDER_RECIPE)
    assert dm.capture_kind.kind == kind
    assert dm.pixel_jitter == expected["pixel_jitter"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("capture kind:")]
    assert len(lines) == 1 and lines[0].startswith(f"capture kind: {kind} ({dm.capture_kind.reason})")
    _, spelled = _batch_with_seed(path, tmp_path, **expected)
    _, flipped = _batch_with_seed(path, tmp_path, **other)
    for key in ("rays_o", "rays_d", "rgb", "background"):
        torch.testing.assert_close(auto[key], spelled[key], rtol=0, atol=0)
    assert not torch.equal(auto["rays_d"], flipped["rays_d"])
    assert "alpha" not in auto  # only for the opacity loss (TrainingFeedback.alpha_targets)
    # an explicit value wins over the images'
    dm, _ = _batch_with_seed(path, tmp_path, pixel_jitter=other["pixel_jitter"])
    assert dm.pixel_jitter == other["pixel_jitter"]
    assert dm.capture_kind.kind == kind
    with pytest.raises(ValueError, match="^data.pixel_jitter=sometimes: expected one of True, False, auto$"):
        NeRFDataModule(path=str(path), pixel_jitter="sometimes")


@pytest.mark.parametrize("capture", ["scene", "pinhole_scene"])
def test_val_batch_is_a_whole_image_over_white(
    capture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    scene = request.getfixturevalue(capture)
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    dm.ensure_device(torch.device("cpu"))
    b = dm.val_batch(1)
    assert (b["height"], b["width"]) == (H, W) and b["rgb"].shape == (H * W, 3)
    # row-major over the image, targets over white from the decoded file
    rows, cols = np.divmod(np.arange(H * W), W)
    np.testing.assert_array_equal(b["py"].numpy(), rows)
    np.testing.assert_array_equal(b["px"].numpy(), cols)
    rgba = _decoded_pixels(dm, "val", b["view_ids"], b["px"], b["py"])
    expected = rgba[:, :3] * rgba[:, 3:] + (1 - rgba[:, 3:])
    np.testing.assert_allclose(b["rgb"].double().numpy(), expected, rtol=0, atol=1e-6)
    assert (rgba[:, 3] == 0).any()
    # validation rays go through the pixel centres
    frac = _assert_rays_land_in_their_pixels(scene, dm, "val", b)
    np.testing.assert_allclose(frac, 0.5, rtol=0, atol=TOLERANCE_PX[capture == "scene"])


def test_device_move_leaves_no_tensor_behind(scene: Path, tmp_path: Path) -> None:
    """After the move to the training device, every tensor the batches read lives there (meta device
    stands in for a GPU); dtypes are unchanged."""
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    before = {name: t.dtype for name, t in _tensors(dm)}
    dm.ensure_device(torch.device("meta"))
    after = dict(_tensors(dm))
    assert set(after) == set(before) and len(after) > 10
    stale = [name for name, t in after.items() if t.device.type != "meta"]
    assert not stale, f"left on the CPU after the move: {stale}"
    assert {name: t.dtype for name, t in after.items()} == before


def _tensors(dm: NeRFDataModule):
    """(name, tensor) of every tensor held by the data sets, their undistortion tables and the sampler."""
    holders = {"train_set": dm.train_set, "val_set": dm.val_set}
    holders.update({f"{k}.undistortion": v.undistortion for k, v in list(holders.items())})
    for prefix, obj in holders.items():
        for name, value in vars(obj).items():
            if isinstance(value, torch.Tensor):
                yield f"{prefix}.{name}", value
    for name, value in dm.sampler.state_dict(keep_vars=True).items():
        yield f"sampler.{name}", value
    for name, value in vars(dm.sampler).items():
        if isinstance(value, torch.Tensor):
            yield f"sampler.{name}", value


def test_unknown_sampler_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="data.sampler='nope'"):
        NeRFDataModule(sampler="nope")


@pytest.mark.parametrize(
    ("capture", "weight"),
    [("scene", 0.1),  # RGBA renders over a transparent background, instant-ngp transforms.json
     ("blender_photos", 0.0),  # opaque photographs in Blender split files
     ("opaque_rgba_capture", 0.0)],  # RGBA files whose alpha is 255 everywhere
)
def test_the_opacity_loss_auto_is_on_for_renders_only(
    capture: str,
    weight: float,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``model.net.loss.alpha_weight`` is 0 (off) by default on every capture; ``auto``, resolved where the
    train
    app builds the model from the capture, is 0.1 for renders, whose batches then carry the pixels' alpha
    (the loss's target), and 0 for photographs, whose batches carry none."""
    import hydra

    from nerf_lightning.apps.train import build_model
    from nerf_lightning.run.config import compose_train_config

    path = request.getfixturevalue(capture)
    default = compose_train_config([f"data.path={path}", "experiment=cpu"], tmp_path)
    assert default.model.net.loss.alpha_weight == 0.0
    dm_default = hydra.utils.instantiate(default.data)
    dm_default.setup("fit")
    assert build_model(default, dm_default)[0].alpha_weight == 0.0 and not dm_default.feedback.alpha_targets
    auto = [f"data.path={path}", "experiment=cpu", "data.batch_size=64", "model.net.loss.alpha_weight=auto"]
    cfg = compose_train_config(auto, tmp_path)
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup("fit")
    with caplog.at_level(logging.INFO, logger="nerf_lightning.train"):
        model, _ = build_model(cfg, dm)
    assert model.alpha_weight == weight and dm.feedback.alpha_targets == (weight > 0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("opacity loss:")]
    assert lines == [
        f"opacity loss: model.net.loss.alpha_weight=auto -> {weight:g} ("
        + ("renders: empty space charged)" if weight else "photographs: no transparent pixels)")
    ]
    dm.ensure_device(torch.device("cpu"))
    batch = present_fields(dm.train_batch(64))
    assert ("alpha" in batch) == (weight > 0)
    if weight:  # the renders' own alpha: some background, some object
        assert batch["alpha"].min() == 0.0 and batch["alpha"].max() == 1.0
        assert "alpha" in model.train_step_fn.graph_fields()  # the step reads the batch's alpha


def test_alphas_are_the_colours_alpha_channel(scene: Path, tmp_path: Path) -> None:
    """``ViewSet.alphas`` (the fused GPU batch's ``alpha``) gathers what ``colors`` has in its 4th channel,
    and a held-out view's ``alpha`` is its image's alpha: renders have background and object."""
    dm, b = _batch_with_seed(scene, tmp_path)
    ts, (views, ix, iy) = dm.train_set, (b["view_ids"], b["px"], b["py"])
    torch.testing.assert_close(ts.alphas(views, ix, iy), ts.colors(views, ix, iy)[:, 3], rtol=0, atol=0)
    val = dm.val_batch(0)
    assert val["alpha"].shape == val["rgb"].shape[:1]
    assert val["alpha"].min() == 0.0 and val["alpha"].max() == 1.0


def test_draw_is_the_eager_batch_off_a_gpu(scene: Path, tmp_path: Path) -> None:
    """On a CPU (or with ``data.cuda_graph=false``) ``draw`` is ``train_batch``: the same rays for the same
    seed."""
    dm, eager = _batch_with_seed(scene, tmp_path, 64)
    torch.manual_seed(7)
    drawn = present_fields(dm.draw(64))
    assert drawn.keys() == eager.keys()
    for key, value in eager.items():
        assert torch.equal(drawn[key], value), key


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_draw_replays_the_batch_graph_on_a_gpu(scene: Path, tmp_path: Path) -> None:
    """On a GPU ``draw`` replays one captured graph per ray count: the same buffers every call (what the
    step graph's inputs alias), new rays in them, and no host sync."""
    dm = NeRFDataModule(path=str(scene), batch_size=256, cache_dir=str(tmp_path / "cache"))
    dm.setup("fit")
    dm.ensure_device(torch.device("cuda"))
    first = present_fields(dm.draw(256))
    rays = first["rays_d"].clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = present_fields(dm.draw(256))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dm._batch_graphs.captured() == {256: True}
    assert all(second[k].data_ptr() == first[k].data_ptr() for k in first)
    assert not torch.equal(second["rays_d"], rays)
    _assert_rays_land_in_their_pixels(scene, dm, "train", {k: v.cpu() for k, v in second.items()})
