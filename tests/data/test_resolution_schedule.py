"""``data.resolution_schedule``: coarse-to-fine training resolution (issue 9's dynamic-resolution A/B).

Rays are checked against the synthetic generator's own float64 camera model (world space), with the
downscaled camera built here by hand (focal lengths and principal point divided by k, the same lens
coefficients); targets against block means computed with numpy from the decoded image files. The
images are 24 x 20: factor 3 leaves a remainder on both sides (cropped blocks), factor 4 does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import imageio.v3 as iio
import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.resolution import ResolutionSchedule, factor_at
from nerf_lightning.data.synthetic import generate_scene, project
from nerf_lightning.errors import UserError

from .conftest import write_image

W, H = 24, 20


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RGBA, OpenCV k1 k2 p1 p2 distortion (training rays from the undistortion table)."""
    out = tmp_path_factory.mktemp("dynres") / "scene"
    generate_scene(out, n_views=9, width=W, height=H, supersample=1, distortion=True)
    return out


def _dm(scene: Path, tmp_path: Path, **kwargs) -> NeRFDataModule:
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"), **kwargs)
    dm.setup("fit")
    dm._ensure_device(torch.device("cpu"))
    return dm


def _project_small(scene: Path, dm: NeRFDataModule, batch: dict, k: int) -> np.ndarray:
    """Project a point of every ray into the camera downscaled by ``k`` (built here from the transforms
    file: fl / k, c / k, same distortion); returns [R, 2] positions in the small image."""
    doc = json.loads((scene / "transforms.json").read_text())
    meta = {Path(f["file_path"]).name: f for f in doc["frames"]}
    offset, scale = np.asarray(doc["offset"]), doc["scale"]
    o_ngp, d_ngp = batch["rays_o"].double().numpy(), batch["rays_d"].double().numpy()
    points = (o_ngp[:, [2, 0, 1]] - offset) / scale + 0.7 * d_ngp[:, [2, 0, 1]]
    view_ids = batch["view_ids"].numpy()
    out = np.empty((len(view_ids), 2))
    for v in np.unique(view_ids):
        f = meta[Path(dm.train_set.frames[v].image_path).name]
        sel = view_ids == v
        u, w = project(
            points[sel], np.asarray(f["transform_matrix"]), doc["fl_x"] / k, doc["fl_y"] / k,
            doc["cx"] / k, doc["cy"] / k, doc["k1"], doc["k2"], doc["p1"], doc["p2"],
        )
        out[sel] = np.stack([u, w], axis=1)
    return out


def _block_means(dm: NeRFDataModule, k: int) -> dict[int, np.ndarray]:
    """view -> [H // k, W // k, 4] premultiplied RGB + alpha block means of the decoded PNG (numpy)."""
    out = {}
    for v, frame in enumerate(dm.train_set.frames):
        img = iio.imread(frame.image_path).astype(np.float64) / 255.0
        assert img.shape == (H, W, 4)
        img = np.concatenate([img[..., :3] * img[..., 3:], img[..., 3:]], axis=-1)
        h2, w2 = H // k, W // k
        out[v] = img[: h2 * k, : w2 * k].reshape(h2, k, w2, k, 4).mean(axis=(1, 3))
    return out


#: undistortion table interpolation error (full-res px; see test_datamodule.TOLERANCE_PX), float32 otherwise
TOL_PX = {True: 5e-3, False: 1e-4}


@pytest.mark.parametrize("capture", ["scene", "pinhole_scene"])
@pytest.mark.parametrize("k", [3, 4])
def test_block_rays_are_the_downscaled_cameras_rays(capture: str, k: int, request, tmp_path: Path) -> None:
    scene_dir = request.getfixturevalue(capture)
    dm = _dm(scene_dir, tmp_path)
    ts = dm.train_set
    n_views = len(ts.frames)
    # every block of every view, through its centre
    bw, bh = W // k, H // k
    v, by, bx = (t.reshape(-1) for t in torch.meshgrid(
        torch.arange(n_views), torch.arange(bh), torch.arange(bw), indexing="ij"))
    half = torch.full(v.shape, 0.5)
    bg = torch.rand(v.numel(), 3)
    b = ts.block_batch(v, bx, by, half, half, bg, k)
    small = _project_small(scene_dir, dm, b, k)
    expected = np.stack([bx.numpy() + 0.5, by.numpy() + 0.5], axis=1)
    np.testing.assert_allclose(small, expected, rtol=0, atol=TOL_PX[ts.undistortion.enabled] / k + 1e-4)
    # the reported full-resolution pixel is the block's centre pixel
    np.testing.assert_array_equal(b["px"].numpy(), bx.numpy() * k + k // 2)
    np.testing.assert_array_equal(b["py"].numpy(), by.numpy() * k + k // 2)


@pytest.mark.parametrize("k", [3, 4])
def test_block_targets_are_block_means_over_the_background(scene: Path, k: int, tmp_path: Path) -> None:
    # the photograph recipe spelled out (random positions, random backgrounds): these are RGBA renders
    dm = _dm(scene, tmp_path, pixel_jitter=True, train_background="random")
    dm.alpha_targets = True
    torch.manual_seed(0)
    b = dm.train_batch(2048, factor=k)
    means = _block_means(dm, k)
    small = _project_small(scene, dm, b, k)  # where the ray is in the small image: its block
    bx, by = np.floor(small[:, 0]).astype(int), np.floor(small[:, 1]).astype(int)
    assert bx.min() >= 0 and by.min() >= 0 and bx.max() == W // k - 1 and by.max() == H // k - 1
    rgba = np.stack([means[int(v)][y, x] for v, x, y in zip(b["view_ids"], bx, by, strict=True)])
    expected = rgba[:, :3] + b["background"].double().numpy() * (1 - rgba[:, 3:])
    np.testing.assert_allclose(b["rgb"].double().numpy(), expected, rtol=0, atol=1e-6)
    assert ((rgba[:, 3] > 0) & (rgba[:, 3] < 1)).any()  # edge blocks (partial alpha) drawn
    np.testing.assert_allclose(b["alpha"].double().numpy(), rgba[:, 3], rtol=0, atol=1e-6)  # block mean
    # random positions spread over the whole block (like the full-resolution path within a pixel)
    frac = small - np.floor(small)
    assert frac.min() > -1e-3 and frac.max() < 1 + 1e-3 and frac.std(axis=0).min() > 0.2
    # the full-resolution pixel handed to the sampler is inside the ray's block
    np.testing.assert_array_equal(b["px"].numpy() // k, bx)
    np.testing.assert_array_equal(b["py"].numpy() // k, by)


@pytest.mark.parametrize("channels", [3, 4])
def test_target_is_the_mean_of_the_blocks_composited_pixels(make_ngp, channels: int, tmp_path: Path) -> None:
    """Random RGB(A) images (any colour under any alpha): a block target is the mean over the block of
    each pixel composited over the ray's background, the full-resolution target averaged."""
    root = make_ngp(n=4, size=(16, 12))
    for i, png in enumerate(sorted((root / "images").glob("*.png"))):
        write_image(png, 16, 12, seed=100 + i, channels=channels)
    dm = NeRFDataModule(path=str(root), cache_dir=str(tmp_path / "cache"), test_every=4)
    dm.setup("fit")
    dm._ensure_device(torch.device("cpu"))
    assert dm.train_set.channels == channels
    k = 4
    v, by, bx = (t.reshape(-1) for t in torch.meshgrid(
        torch.arange(len(dm.train_set.frames)), torch.arange(3), torch.arange(4), indexing="ij"))
    n = v.numel()
    bg = torch.rand(n, 3)
    b = dm.train_set.block_batch(v, bx, by, torch.rand(n), torch.rand(n), bg, k)
    for i in range(n):
        img = iio.imread(dm.train_set.frames[int(v[i])].image_path).astype(np.float64) / 255.0
        block = img[int(by[i]) * k : (int(by[i]) + 1) * k, int(bx[i]) * k : (int(bx[i]) + 1) * k]
        rgb, alpha = block[..., :3], block[..., 3:] if channels == 4 else np.ones_like(block[..., :1])
        composited = rgb * alpha + bg[i].double().numpy() * (1 - alpha)
        expected = composited.mean(axis=(0, 1))
        np.testing.assert_allclose(b["rgb"][i].double().numpy(), expected, rtol=0, atol=1e-6)


def test_factor_one_stage_is_the_full_resolution_path(scene: Path, tmp_path: Path) -> None:
    dm = _dm(scene, tmp_path)
    torch.manual_seed(3)
    a = dm.train_batch(256)
    torch.manual_seed(3)
    b = dm.train_batch(256, factor=1)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_schedule_parse_and_stage_steps() -> None:
    s = ResolutionSchedule.parse([[0.0, 4], [0.1, 2], [0.25, 1]])
    steps = s.resolve(1000)
    assert steps == ((0, 4), (100, 2), (250, 1))
    assert [factor_at(steps, i) for i in (0, 99, 100, 249, 250, 999)] == [4, 4, 2, 2, 1, 1]
    # integers are steps (no max_steps needed), mixed kinds resolve together
    assert ResolutionSchedule.parse([[0, 2], [300, 1]]).resolve(None) == ((0, 2), (300, 1))
    assert ResolutionSchedule.parse([[0, 4], [50, 2], [0.5, 1]]).resolve(400) == ((0, 4), (50, 2), (200, 1))
    assert ResolutionSchedule.parse(None) is None and ResolutionSchedule.parse([]) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([[0.0, 4], [0.5, 2], [0.3, 1]], "strictly increase"),
        ([[0, 4], [100, 2], [100, 1]], "strictly increase"),
        ([[0.0, 4], [0.1, 0]], "integer >= 1"),
        ([[0.0, 4], [0.1, 1.5]], "integer >= 1"),
        ([[0.0, "2"], [0.1, 1]], "integer >= 1"),
        ([[0.1, 2], [0.5, 1]], "start at step 0"),
        ([[0.0, 2, 1]], "pair"),
        ([[0.0, 2], [1.5, 1]], "in \\[0, 1\\]"),
        ([[0, 2], [-5, 1]], ">= 0"),
        ("0:4,0.5:1", "list"),
    ],
)
def test_invalid_schedule_is_a_clear_error(spec, message: str) -> None:
    with pytest.raises(ValueError, match=f"data.resolution_schedule: .*{message}"):
        NeRFDataModule(resolution_schedule=spec)


def test_schedule_errors_known_only_at_fit_time(scene: Path, tmp_path: Path) -> None:
    # a factor larger than the images
    spec = [[0, 32], [10, 1]]
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "c"), resolution_schedule=spec)
    with pytest.raises(ValueError, match="data.resolution_schedule: downscale factor 32 is larger"):
        dm.setup("fit")
    # fractions that collide with step counts once max_steps is known; fractions without max_steps
    for spec, max_steps, message in (
        ([[0, 4], [100, 2], [0.1, 1]], 1000, "strictly increase"),
        ([[0.0, 4], [0.5, 1]], -1, "positive trainer.max_steps"),
    ):
        dm = _dm(scene, tmp_path, resolution_schedule=spec)
        dm.trainer = SimpleNamespace(max_steps=max_steps, max_epochs=-1, accumulate_grad_batches=1)
        with pytest.raises(UserError, match=f"data.resolution_schedule: .*{message}"):
            dm.stage_factor(0)


def test_stage_switches_at_its_steps_and_frees_the_previous_stage(scene: Path, tmp_path: Path) -> None:
    dm = _dm(scene, tmp_path, resolution_schedule=[[0.0, 4], [0.1, 2], [0.25, 1]])
    dm.trainer = SimpleNamespace(max_steps=40, max_epochs=None, accumulate_grad_batches=1)
    seen = []
    for step in range(40):
        k = dm.stage_factor(step)
        seen.append(k)
        dm.train_batch(64, k)  # builds the stage's block images
        assert set(dm.train_set.blocks) <= {k} and (k == 1 or k in dm.train_set.blocks)
    assert seen == [4] * 4 + [2] * 6 + [1] * 30
    assert dm.state_dict()["resolution_schedule"] == {
        "spec": [[0.0, 4], [0.1, 2], [0.25, 1]], "steps": [[0, 4], [4, 2], [10, 1]]}
    # epochs instead of max_steps: steps_per_epoch * max_epochs / accumulation
    dm = _dm(scene, tmp_path, resolution_schedule=[[0.0, 2], [0.5, 1]], steps_per_epoch=10)
    dm.trainer = SimpleNamespace(max_steps=-1, max_epochs=4, accumulate_grad_batches=2)
    assert [dm.stage_factor(s) for s in (9, 10)] == [2, 1]


@pytest.mark.parametrize("sampler", ["uniform", "loss_weighted"])
def test_samplers_draw_coarse_batches(sampler: str, scene: Path, tmp_path: Path) -> None:
    samplers = {
        "uniform": {"_target_": "nerf_lightning.data.sampler.UniformRaySampler", "_partial_": True},
        "loss_weighted": {"_target_": "nerf_lightning.data.sampler.LossWeightedRaySampler", "_partial_": True,
                          "warmup_steps": 2, "update_every": 1, "error_map_resolution": 4},
    }
    from hydra.utils import instantiate

    dm = _dm(scene, tmp_path, sampler=sampler, samplers={k: instantiate(v) for k, v in samplers.items()})
    torch.manual_seed(1)
    for step in range(4):
        b = dm.train_batch(512, factor=4)
        assert b["rays_o"].shape == (512, 3) and b["rgb"].shape == (512, 3)
        assert int(b["px"].max()) < W and int(b["py"].max()) < H and int(b["px"].min()) >= 0
        # a loss on the coarse targets feeds the per-view statistics (and the error map) as usual
        dm.sampler.update(b["view_ids"], b["px"], b["py"], (b["rgb"] ** 2).mean(-1))
        dm.sampler.step(step)
    assert torch.isfinite(dm.sampler.view_probs).all()
    if sampler == "loss_weighted":
        assert bool(dm.sampler.seen.all())


class _Probe(L.LightningModule):
    """Records the datamodule's stage at every optimizer step, and checks the batch it got."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.stages: list[tuple[int, int]] = []

    def training_step(self, batch, batch_idx):
        dm = self.trainer.datamodule
        self.stages.append((self.global_step, dm.train_factor))
        assert batch["rgb"].shape == (64, 3)
        return ((batch["rgb"] - self.w) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(scene: Path, tmp_path: Path, max_steps: int, spec, ckpt_path: str | None = None, ckpt_every=None):
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"), batch_size=64,
                        steps_per_epoch=3, resolution_schedule=spec)
    probe = _Probe()
    callbacks = []
    if ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=ckpt_every,
                                         save_top_k=-1, filename="{step}"))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=callbacks, enable_checkpointing=bool(ckpt_every))
    trainer.fit(probe, datamodule=dm, ckpt_path=ckpt_path)
    return probe.stages, dm


def test_resume_continues_in_the_checkpoints_stage(scene: Path, tmp_path: Path) -> None:
    spec = [[0.0, 4], [0.5, 2], [0.75, 1]]
    stages, _ = _fit(scene, tmp_path, 8, spec, ckpt_every=5)
    assert stages == [(s, k) for s, k in zip(range(8), [4, 4, 4, 4, 2, 2, 1, 1], strict=True)]
    ckpt = tmp_path / "ckpt" / "step=5.ckpt"
    assert ckpt.is_file()
    state = torch.load(ckpt, weights_only=True)["NeRFDataModule"]
    assert state["resolution_schedule"]["steps"] == [[0, 4], [4, 2], [6, 1]]
    # same command resumed: the same stages from step 5 on
    resumed, _ = _fit(scene, tmp_path, 8, spec, ckpt_path=str(ckpt))
    assert resumed == stages[5:]
    # resumed with a longer run: the checkpoint's stage steps stay (no fall back to coarse at step 5)
    longer, _ = _fit(scene, tmp_path, 16, spec, ckpt_path=str(ckpt))
    assert longer == [(5, 2)] + [(s, 1) for s in range(6, 16)]
    # a changed schedule applies as configured
    changed, _ = _fit(scene, tmp_path, 8, [[0, 2], [7, 1]], ckpt_path=str(ckpt))
    assert changed == [(5, 2), (6, 2), (7, 1)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_batches_follow_the_stage_on_cuda(scene: Path, tmp_path: Path) -> None:
    """``data.cuda_graph``: each stage replays its own graph (captured when the stage starts), the
    previous stage's graph is freed, replays do not sync with the host, targets are block means."""
    dm = NeRFDataModule(path=str(scene), cache_dir=str(tmp_path / "cache"),
                        resolution_schedule=[[0, 4], [3, 2], [6, 1]])
    dm.setup("fit")
    dm._ensure_device(torch.device("cuda"))
    dm.trainer = SimpleNamespace(max_steps=9, max_epochs=None, accumulate_grad_batches=1)
    n = 1024
    for step in range(9):
        k = dm.stage_factor(step)
        first = (n, k) not in dm._batch_graphs.captured()
        if not first:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            b = dm._batch_graphs.batch(n, k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert dm._batch_graphs.captured() == {(n, k): True}
        assert b["rays_o"].shape == (n, 3) and b["rgb"].is_cuda
        ts = dm.train_set
        if k == 1:
            color = ts.colors(b["view_ids"], b["px"], b["py"])
            rgb, alpha = color[:, :3] * color[:, 3:], color[:, 3:]
        else:
            color = ts.block_images(k).gather(b["view_ids"], b["px"] // k, b["py"] // k)
            rgb, alpha = color[:, :3], color[:, 3:]
        torch.testing.assert_close(b["rgb"], rgb + b["background"] * (1 - alpha))
        assert set(ts.blocks) <= {k}


class _Stages(L.Callback):
    def __init__(self) -> None:
        self.factors: list[int] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.factors.append(trainer.datamodule.train_factor)


def test_budgeted_training_runs_through_the_stages(tiny_scene: Path, compose_cfg) -> None:
    """The fixed-sample-budget step (the GPU default, static shapes) on the CPU reference path, through
    a coarse-to-fine schedule."""
    from runs import TINY

    from nerf_lightning.apps.train import train

    torch.set_num_threads(2)
    budget = ["model.step.sample_budget=3072", "model.step.march_budget=8192", "model.step.n_rays_init=128"]
    stages = _Stages()
    cfg = compose_cfg(f"data.path={tiny_scene}", "trainer.max_steps=24", *TINY, *budget,
                      "data.resolution_schedule=[[0.0,4],[0.25,2],[0.5,1]]", "logger=none")
    metrics = train(cfg, [stages])
    assert metrics["steps"] == 24 and np.isfinite(metrics["val/psnr"])
    assert stages.factors == [4] * 6 + [2] * 6 + [1] * 12
