"""The training DataModule: a capture held on the training device, rays generated on the device.

Batches (what ``on_after_batch_transfer`` hands the LightningModule):

training :class:`~nerf_lightning.data.ray_batch.RayBatch` (``data/ray_batch.py`` documents each field):
    ``rays_o`` / ``rays_d`` (NGP space), the target ``rgb`` (RGBA captures: composited over
    ``background``, a random colour per ray), ``view_ids`` / ``px`` / ``py`` (for the loss-weighted
    sampler: the full-resolution pixel the ray goes through) and ``alpha`` (only when the model's opacity
    loss reads it, ``TrainingFeedback.alpha_targets``, on images that carry alpha; else None).
validation / test ``dict`` (one whole held-out view):
    the training batch's fields as keys for all ``H * W`` pixels in row-major order (``view_ids``: the
    view), with ``alpha`` [R] f32 (the image's alpha, 1 for RGB captures), plus ``height``, ``width``
    (ints), ``view`` (int, index into that split's frames) and ``train_view`` (int: the frame's index
    among the training views when it is one, e.g. under ``val_split=train``, else -1; its learned pose
    and exposure apply).

Splits: ``val`` is what validation during training renders (the capture's val split, else its test
split, at most ``max_val_views`` of them); ``test`` is the final evaluation (``trainer.test``): the
capture's test split when it has one, else the held-out views (at most ``max_test_views`` of them).
:attr:`NeRFDataModule.eval_split` names which. A capture without any held-out view is refused in
``setup`` (a run that validates on nothing would report a NaN PSNR).

The loaders only yield small index tensors; the pixels (uint8) live on the device, so a training step
costs no host->device copy and no host synchronization (a rank's shard, host memory: ``training_pixels``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Injected, Note, PowerOfTwo, Range
from nerf_lightning.data import heldout
from nerf_lightning.data.batch_graphs import BatchGraphs
from nerf_lightning.data.cameras import intrinsics_tensor, poses_tensor
from nerf_lightning.data.capture_identity import FINGERPRINT_KEY, fingerprint
from nerf_lightning.data.capture_kind import CaptureKind
from nerf_lightning.data.formats import CaptureError, load_capture
from nerf_lightning.data.image_sizes import check_downscale
from nerf_lightning.data.images import load_images
from nerf_lightning.data.loaders import StepIndices, StepLoader, ViewIndices, rank_views
from nerf_lightning.data.masks import load_masks, packed_keep
from nerf_lightning.data.ray_batch import RayBatch
from nerf_lightning.data.ray_batches import image_batch, resolve_recipe
from nerf_lightning.data.sampler import RaySampler, UniformRaySampler
from nerf_lightning.data.shards import classify_shards, rank_and_world
from nerf_lightning.data.training_pixels import TrainingPixels
from nerf_lightning.data.types import Capture
from nerf_lightning.data.view_set import ViewSet
from nerf_lightning.training.feedback import TrainCameras, TrainingFeedback

log = logging.getLogger(__name__)


class NeRFDataModule(L.LightningDataModule):
    """A capture (instant-ngp / Blender / nerfstudio ``transforms.json``) for training and validation.

    Args:
        path: capture folder; ``None`` trains on the project's default synthetic scene, generated on
            first use under ``scene_root``.
        format: ``auto | ngp | blender | nerfstudio``.
        downscale: integer image downscale factor (intrinsics follow).
        test_every: hold out every Nth frame for validation when the capture has no split files.
        batch_size: rays per training step.
        steps_per_epoch: length of one training "epoch" (validation runs every
            ``trainer.check_val_every_n_epoch`` of these).
        sampler: name of the training ray sampler, a key of ``samplers``.
        samplers: ``RaySampler`` factories (``_partial_`` configs) taking ``widths``/``heights``.
        max_val_views: validate on at most this many held-out views (evenly spaced); ``None`` = all.
        max_test_views: the final evaluation renders at most this many of its views (evenly spaced);
            ``None`` = all.
        val_split: which frames validation renders: ``val`` (the held-out views; the test split when
            the capture has no val split), ``test`` (the test split; an error when there is none),
            ``auto`` (test split if there is one, else ``val``), ``train`` (the training views).
        cuda_graph: ``model.cuda_graph``, the run's one switch of CUDA graphs (the train app passes it):
            ``auto`` (on a GPU, draw each training batch by replaying a CUDA graph: one launch instead
            of ~40, the batch lands in the same buffers every step), ``true`` or ``false``.
        image_workers / cache_dir: parallel decoding and the uint8 image cache.
        pixel_jitter: training rays through random points of their pixels or their centres,
            ``true|false|auto`` (``data/ray_batches.py``; ``auto``: as :attr:`capture_kind` says).
        aabb_scale: override the capture's ``aabb_scale`` (outer box and occupancy cascades); ``None``
            keeps the value of the transforms file (or the format's default).
        feedback: the run's :class:`~nerf_lightning.training.feedback.TrainingFeedback` (the train app
            makes it around the clock of ``batch_rule``): this rank's batch follows its clock and work
            share, and ``setup`` attaches the capture, the training cameras and the ray sampler to it.
            None: one process's, ``per_device``.
        shard / storage / storage_fraction: each rank's shard of the training views, and where the
            pixels live (``data/training_pixels.py``).
    """

    def __init__(
        self,
        path: str | None = None,
        format: str = "auto",
        downscale: Annotated[int, Range(low=1)] = 1,
        test_every: Annotated[int, Range(low=0), Note("0: no holdout")] = 8,
        batch_size: Annotated[int, Range(low=1), Note("rays per step")] = 65536,
        steps_per_epoch: Annotated[int, Range(low=1)] = 1000,
        sampler: str = "uniform",
        samplers: Mapping[str, Callable[..., RaySampler]] | None = None,
        max_val_views: Annotated[int | None, Range(low=1), Note("null: every held-out view")] = None,
        max_test_views: Annotated[
            int | None, Range(low=1), Note("null: every view of the final evaluation")
        ] = None,
        min_sharpness: float | None = None,
        image_workers: Annotated[int | None, Range(low=1)] = None,
        cache_dir: str | None = None,
        scene_root: str = "outputs/scenes",
        camera_model: str | None = None,
        val_split: Literal["val", "test", "auto", "train"] = "val",
        cuda_graph: Annotated[bool | Literal["auto"], Injected("the train app: model.cuda_graph")] = "auto",
        aabb_scale: Annotated[
            int | None, PowerOfTwo(), Range(high=128), Note("null: the capture's own")
        ] = None,
        pixel_jitter: bool | Literal["auto"] = "auto",
        feedback: Annotated[TrainingFeedback | None, Injected("the train app: the run's feedback")] = None,
        shard: Annotated[bool | Literal["auto"], Note("auto: with several ranks")] = "auto",
        storage: Literal["auto", "device", "host"] = "auto",
        storage_fraction: Annotated[float, Range(above=0, high=1)] = 0.5,
    ) -> None:
        super().__init__()
        check_arguments(NeRFDataModule, locals())
        self._placement = {"shard": shard, "storage": storage, "storage_fraction": storage_fraction}
        self._pixel_jitter_cfg = pixel_jitter
        #: renders or photographs, decided from the training images by setup() (``data/capture_kind.py``)
        self.capture_kind: CaptureKind | None = None
        #: the training recipe, resolved by setup() (``auto``: from :attr:`capture_kind`)
        self.pixel_jitter: bool | None = None
        self._eval_bg: Tensor | None = None
        #: the run's clock and what the model and the callbacks report to and read of this DataModule
        self.feedback = feedback if feedback is not None else TrainingFeedback()
        self.clock = self.feedback.clock
        self.cuda_graph = cuda_graph
        #: rays per step -> the captured batch graph and its static batch
        self._batch_graphs = BatchGraphs(self.train_batch, strict=cuda_graph is True)
        self.path = path
        self.format = format
        self.downscale = int(downscale)
        self.test_every = int(test_every)
        self.batch_size = int(batch_size)
        self.steps_per_epoch = int(steps_per_epoch)
        factories = dict(samplers or {"uniform": UniformRaySampler})
        if sampler not in factories:
            raise ValueError(f"data.sampler={sampler!r} is not one of data.samplers: {sorted(factories)}")
        self.sampler_name = sampler
        self.sampler_factory = factories[sampler]
        self.max_val_views = max_val_views
        self.max_test_views = max_test_views
        self.min_sharpness = min_sharpness
        self.image_workers = image_workers
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.scene_root = Path(scene_root)
        self.camera_model_override = camera_model
        self.val_split = val_split
        self.aabb_scale_override = aabb_scale
        self.capture: Capture | None = None
        #: the training pixels this rank holds (all views, or its shard) and where they live
        self.train_pixels: TrainingPixels | None = None
        self.val_set: ViewSet | None = None
        self.test_set: ViewSet | None = None
        self.sampler: RaySampler | None = None
        self._device: torch.device | None = None
        #: image path -> index among the training views (``train_view`` of the evaluation batches)
        self._train_index: dict[Path, int] = {}

    # ----------------------------------------------------------------------------------- setup
    def resolve_path(self) -> Path:
        if self.path is not None:
            return Path(self.path).expanduser()
        from nerf_lightning.data.synthetic import ensure_default_scene

        return Path(ensure_default_scene(self.scene_root))

    def prepare_data(self) -> None:
        # Runs on one process per node: generate the default scene before the ranks read it.
        self.resolve_path()

    def setup(self, stage: str | None = None) -> None:
        if self.capture is not None:  # a resumed run of another world size: re-shard
            if self.train_pixels is not None and self.train_pixels.load(*rank_and_world(self.trainer)):
                self._device = None
            return
        path = self.resolve_path()
        capture = load_capture(
            path,
            format=self.format,
            downscale=self.downscale,
            test_every=self.test_every,
            min_sharpness=self.min_sharpness,
            aabb_scale=self.aabb_scale_override,
        )
        model = self.camera_model_override or heldout.capture_camera_model(capture)
        check_downscale(capture, self.downscale, path)  # before any pixel is decoded
        self.capture = capture
        if not capture.train:
            raise CaptureError(f"{path}: no training views ({len(capture.val)} held out, none left to train)")
        decode = {"downscale": self.downscale, "num_workers": self.image_workers, "cache_dir": self.cache_dir}
        pixels = TrainingPixels(capture.train, decode, model, self.feedback, path, **self._placement)
        self.train_pixels = pixels
        pixels.load(*rank_and_world(self.trainer))
        self._resolve_recipe(classify_shards(pixels.pixels))  # one recipe over all ranks' views
        self._train_index = {Path(f.image_path): i for i, f in enumerate(capture.train)}
        doubled = heldout.heldout_in_training(capture) if self.val_split != "train" else []
        if doubled:
            shown = ", ".join(doubled[:5]) + (", ..." if len(doubled) > 5 else "")
            log.warning(
                "%s: %d held-out frame(s) are training views too (%s): their scores are not held out; list "
                "each image in one split only", path, len(doubled), shown,
            )  # fmt: skip
        val_frames = heldout.validation_frames(capture, self.val_split, path)
        if not val_frames:
            raise CaptureError(heldout.no_heldout_message(path, capture, self.test_every))
        val_frames = heldout.evenly_spaced(val_frames, self.max_val_views)
        self.val_set = _heldout_views(val_frames, decode, model)
        test_frames = heldout.evenly_spaced(capture.test or capture.val, self.max_test_views)
        if [f.image_path for f in test_frames] == [f.image_path for f in val_frames]:
            self.test_set = self.val_set  # the same views: keep one copy of their pixels
        else:
            self.test_set = _heldout_views(test_frames, decode, model)
        widths, heights = pixels.sizes  # the sampler, the cameras and the per-view parameters: all views
        masks = {} if pixels.kept is None else {"kept": pixels.kept}  # only captures with masks pay for them
        self.sampler = self.sampler_factory(widths=widths.clone(), heights=heights.clone(), **masks)
        cameras = TrainCameras(poses_tensor(capture.train), intrinsics_tensor(capture.train), widths, heights)
        self.feedback.attach(capture, cameras, self.sampler)
        log.info(
            "capture %s (%s): %d train / %d val / %d %s views, %dx%d (downscale %d), aabb_scale %d",
            path, capture.format, len(capture.train), len(val_frames), len(self.test_set.frames),
            self.eval_split, int(widths[0]), int(heights[0]), self.downscale, capture.aabb_scale,
        )  # fmt: skip

    def _resolve_recipe(self, kind: CaptureKind) -> None:
        self.capture_kind = kind
        self.pixel_jitter = resolve_recipe(kind, self._pixel_jitter_cfg)

    @property
    def aabb_scale(self) -> int:
        assert self.capture is not None, "call setup() first"
        return self.capture.aabb_scale

    @property
    def is_photograph(self) -> bool:
        """Whether the capture is photographs rather than renders (:attr:`capture_kind`, decided from
        the training images): the per-view components' ``enabled=auto``."""
        assert self.capture_kind is not None, "call setup() first"
        return not self.capture_kind.is_render

    @property
    def train_set(self) -> ViewSet | None:
        """The training views this rank holds (all of them, or its shard: ``data.shard``)."""
        return self.train_pixels.views if self.train_pixels is not None else None

    @property
    def n_train_views(self) -> int:
        """All training views (under ``data.shard`` a rank holds the pixels of some of them)."""
        assert self.capture is not None, "call setup() first"
        return len(self.capture.train)

    @property
    def train_poses(self) -> Tensor:
        """The training views' given camera-to-world matrices, NGP space, float32 [V, 3, 4] (a copy)."""
        assert self.capture is not None, "call setup() first"
        return poses_tensor(self.capture.train)

    @property
    def has_alpha(self) -> bool:
        return bool(self.train_set is not None and self.train_set.channels == 4)

    @property
    def eval_split(self) -> str:
        """Which split the final evaluation (``test_dataloader``) renders: ``"test"`` when the capture
        has a test split, else ``"val"`` (all held-out views, even when ``max_val_views`` thins
        validation during training)."""
        assert self.capture is not None, "call setup() first"
        return "test" if self.capture.test else "val"

    def eval_background(self, device: torch.device) -> Tensor:
        """The capture's evaluation background, float32 [3] on ``device``, made once per device.
        Read-only."""
        assert self.capture is not None
        bg = self._eval_bg
        if bg is None or bg.device != device:
            bg = torch.tensor(self.capture.eval_background, dtype=torch.float32, device=device)
            self._eval_bg = bg
        return bg

    # ------------------------------------------------------------------------------- loaders
    def train_dataloader(self) -> DataLoader:
        # Own generators: a DataLoader draws a seed from the given generator (by default the global
        # RNG) every time an epoch starts, which would shift the training randomness of a resumed run.
        clock = self.clock
        if self.trainer is not None and not clock.bound and not clock.trivial:
            raise RuntimeError(
                f"batch_rule={clock.configured.name}: the model must share this DataModule's feedback, "
                "NeRFModule(feedback=datamodule.feedback), as the train app builds them"
            )
        # an epoch is data.steps_per_epoch reference steps (the clock's rate of them per optimizer step)
        steps = self.clock.steps_for(self.steps_per_epoch)
        return StepLoader(StepIndices(steps), batch_size=None, num_workers=0, generator=torch.Generator())

    def val_dataloader(self) -> DataLoader:
        """Each held-out view counted exactly once over all ranks (``loaders.rank_views``)."""
        return self._view_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        """The final evaluation's views (:attr:`eval_split`), one whole image per batch, each view
        exactly once over all ranks (as ``val_dataloader``)."""
        return self._view_loader(self.test_set)

    def _view_loader(self, views_set: ViewSet | None) -> DataLoader:
        n = len(views_set.frames) if views_set is not None else 0
        views = ViewIndices(rank_views(n, *rank_and_world(self.trainer)))
        return DataLoader(views, batch_size=None, num_workers=0, generator=torch.Generator())

    # -------------------------------------------------------------------------- device batches
    def ensure_device(self, device: torch.device) -> None:
        """Move the training pixels, the held-out views and the sampler to ``device`` (once per device):
        what a batch on ``device`` is drawn from. Lightning's batch transfer calls it; code that draws
        batches outside a Trainer (benchmarks, tests) calls it first."""
        if self._device == device:
            return
        assert self.train_pixels is not None and self.sampler is not None
        self.train_pixels.to(device)
        for views in {id(v): v for v in (self.val_set, self.test_set) if v is not None}.values():
            views.to(device)
        self.sampler.to(device)
        self._device = device

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> RayBatch | dict[str, Any]:
        trainer = self.trainer
        if isinstance(batch, Tensor):
            device = batch.device
        else:
            device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        self.ensure_device(device)
        if trainer is not None and trainer.training:
            return self.draw(self.rays_per_step())
        if trainer is not None and trainer.testing:
            return self.test_batch(int(batch))
        return self.val_batch(int(batch))

    def rays_per_step(self) -> int:
        """This rank's rays per step (``data.batch_size`` under the batch rule: ``feedback``)."""
        return self.feedback.rays_per_step(self.batch_size)

    # ------------------------------------------------------------------ batch drawing
    def draw(self, n_rays: int) -> RayBatch:
        """A training batch as the training loop gets it: on a GPU replayed from its batch graph (captured
        on first use; ``model.cuda_graph=false``: drawn eagerly), whose tensors the next draw overwrites;
        elsewhere :meth:`train_batch`. The data must be on their device (``ensure_device``)."""
        on_gpu = self._device is not None and self._device.type == "cuda" and self.cuda_graph is not False
        if on_gpu and self.train_pixels is not None and self.train_pixels.host is None:  # host: eager
            return self._batch_graphs.batch(n_rays)
        return self.train_batch(n_rays)

    def train_batch(self, n_rays: int) -> RayBatch:
        """Draw ``n_rays`` training rays on the data's device (no host sync): ``data/ray_batches.py``.
        Their ``view_ids`` are global training views."""
        pixels, sampler = self.train_pixels, self.sampler
        assert pixels is not None and sampler is not None and self.pixel_jitter is not None
        jitter, alpha = self.pixel_jitter, self.feedback.alpha_targets
        return pixels.rays(sampler, n_rays, pixel_jitter=jitter, with_alpha=alpha)

    def val_batch(self, view: int) -> dict[str, Any]:
        """All pixels of validation view ``view`` (row-major), composited over the eval background."""
        assert self.val_set is not None, "call setup() first"
        return self._image_batch(self.val_set, view)

    def test_batch(self, view: int) -> dict[str, Any]:
        """All pixels of final-evaluation view ``view`` (:attr:`eval_split`), over the eval background."""
        assert self.test_set is not None, "call setup() first"
        return self._image_batch(self.test_set, view)

    def _image_batch(self, vs: ViewSet, view: int) -> dict[str, Any]:
        train_view = self._train_index.get(Path(vs.frames[view].image_path), -1)
        return image_batch(vs, view, self.eval_background(vs.pixels.device), train_view)

    # ------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The ray sampler's state, and which capture the run trains on (``data/capture_identity.py``:
        eval refuses to score the checkpoint on another)."""
        state: dict[str, Any] = {"sampler": self.sampler.state_dict()} if self.sampler is not None else {}
        if self.capture is not None:
            state[FINGERPRINT_KEY] = fingerprint(self.capture, self.downscale)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.sampler is not None and "sampler" in state_dict:
            self.sampler.load_state_dict(state_dict["sampler"])


def _heldout_views(frames: list, decode: dict[str, Any], model: str) -> ViewSet:
    """Held-out views with their pixels and, when they have masks, which pixels score."""
    images = load_images(frames, **decode)
    views = ViewSet(frames, images, model)
    views.keep = packed_keep(load_masks(frames, **decode), (images.widths * images.heights).tolist())
    return views
