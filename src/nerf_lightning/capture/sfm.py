"""Structure from motion with pycolmap: camera poses and intrinsics of a folder of images.

The pipeline of COLMAP's command line (and of instant-ngp's ``colmap2nerf.py --run_colmap``):

1. **features**: SIFT keypoints and descriptors of every image (``pycolmap.extract_features``), one
   camera shared by all images (``CameraMode.SINGLE``) of model ``camera_model`` (``OPENCV``: fx, fy,
   cx, cy, k1, k2, p1, p2; ``SIMPLE_RADIAL``: f, cx, cy, k; also ``SIMPLE_PINHOLE``, ``PINHOLE``,
   ``RADIAL``). Images larger than ``max_image_size`` are shrunk for extraction only (the keypoints
   are scaled back: the camera is that of the full images).
2. **matching**: ``exhaustive`` matches every pair (best for up to a few hundred unordered photos),
   ``sequential`` each image with its ``overlap`` successors and the ones 2, 4, 8, ... after it
   (frames of a video); both verify each pair geometrically (RANSAC on the two-view geometry).
3. **mapping**: incremental reconstruction (``pycolmap.incremental_mapping``): an initial pair, then
   one image after another registered against the points seen so far, triangulation and local and
   global bundle adjustment along the way. Images that do not connect may form further, separate
   models; the one with the most registered images is kept.
4. **bundle adjustment** (only with ``refine_principal_point``): one more global bundle adjustment of
   the kept model that also refines the principal point, as ``colmap2nerf.py`` does. Off by
   default: the mapper's own bundle adjustments keep the principal point at the image centre, and
   freeing it on an orbit of views of one object traded it against the rotations (7 px off and
   2.3 degrees of rotation error on the CPU test's synthetic orbit, against 0 px and 0.55 degrees).

Each step runs in a worker thread (pycolmap releases the GIL) while the caller's thread reports
progress: images and verified pairs counted in COLMAP's SQLite database, registered images from
the mapper's callbacks. The counts are read through pycolmap's own ``Database`` (the SQLite library
linked into pycolmap, the one COLMAP writes with: a second copy of SQLite in the process, such as
Python's ``sqlite3``, releases COLMAP's file locks whenever it closes the file and corrupts the
database), with the database in write-ahead-log mode so that readers never block the writer.
Ctrl-C and SIGTERM cancel the running step (pycolmap's cancellation token) and end the caller with
its one-line message. Importing pycolmap installs glog's failure signal handler, which would answer
SIGTERM with a native stack dump and kill the process on the spot (no clean-up): the SIGTERM handler
in place before the import is put back (:func:`import_pycolmap`).

pycolmap is an optional dependency (``pip install 'nerf_lightning[process]'``); without it
:func:`run_sfm` raises a :class:`~nerf_lightning.errors.UserError` that says how to install it.
The API used is pycolmap 4's (``FeatureExtractionOptions``, frames and rigs), tested with 4.2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nerf_lightning.data.types import Intrinsics
from nerf_lightning.errors import UserError

__all__ = [
    "CAMERA_MODELS",
    "MATCHERS",
    "Camera",
    "SfmOptions",
    "SfmResult",
    "import_pycolmap",
    "num_pairs",
    "result_of",
    "run_sfm",
]

CAMERA_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")
MATCHERS = ("exhaustive", "sequential")
INSTALL_HINT = "pip install 'nerf_lightning[process]' (or pip install 'pycolmap>=4.2,<4.3')"

#: (stage, done, total): progress of the running step
Progress = Callable[[str, int, int], None]
STAGES = ("features", "matching", "mapping", "bundle adjustment")
#: how long a cancelled step may take to stop before the caller unwinds anyway (its thread is a daemon)
CANCEL_WAIT_S = 20.0


@dataclass(frozen=True)
class SfmOptions:
    """How the structure from motion runs (see the module docstring for each step)."""

    matcher: str = "exhaustive"
    camera_model: str = "OPENCV"
    #: longer image side for feature extraction (COLMAP's default); larger images are shrunk for it
    max_image_size: int = 3200
    max_num_features: int = 8192
    #: sequential matcher: each image is matched with this many successors (plus 2^k-th ones)
    overlap: int = 10
    #: re-match each verified pair guided by its two-view geometry (more matches, slower)
    guided_matching: bool = False
    refine_principal_point: bool = False
    #: threads of every step (-1: all cores)
    num_threads: int = -1
    seed: int = 0
    #: COLMAP's own log lines on stderr
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.matcher not in MATCHERS:
            raise UserError(f"matcher={self.matcher!r}: expected one of {', '.join(MATCHERS)} (or auto)")
        if self.camera_model not in CAMERA_MODELS:
            raise UserError(f"camera_model={self.camera_model!r}: expected one of {', '.join(CAMERA_MODELS)}")
        if self.overlap < 1:
            raise UserError(f"sfm.overlap={self.overlap}: expected >= 1")
        if self.max_num_features < 64:
            raise UserError(f"sfm.max_num_features={self.max_num_features}: expected >= 64")


@dataclass(frozen=True)
class Camera:
    """The shared camera: COLMAP's model and its intrinsics in pixels.

    Attributes:
        model: COLMAP's camera model (one of :data:`CAMERA_MODELS`).
        intrinsics: focal lengths and principal point (one focal length twice for the models that have
            one) and OpenCV radial-tangential distortion k1, k2, p1, p2 (0 where the model lacks one).
    """

    model: str
    intrinsics: Intrinsics

    def ngp_keys(self) -> dict[str, float | int]:
        """The camera as instant-ngp's top-level ``transforms.json`` keys (``colmap2nerf.py``'s order)."""
        i = self.intrinsics
        return {"fl_x": i.fx, "fl_y": i.fy, "k1": i.k1, "k2": i.k2, "p1": i.p1, "p2": i.p2, "cx": i.cx,
                "cy": i.cy, "w": i.width, "h": i.height}  # fmt: skip


@dataclass
class SfmResult:
    """The kept reconstruction.

    Attributes:
        camera: the shared camera (a model of several cameras: the first image's).
        cam_to_world: image name -> float64 [4, 4] camera-to-world of COLMAP (OpenCV camera: x right,
            y down, z forward) in COLMAP's world frame, for every registered image.
        points: float64 [P, 3] sparse points in the same frame.
        mean_reprojection_error: pixels, over all observations of the kept model.
        registered / unregistered: image names, in input order.
        model_sizes: registered images of each separate model the mapper made, largest first (one
            model when every image connects; an image may belong to several).
        seconds: time per step.
        cameras: image name -> its camera, for a model of several cameras (None: every image has
            ``camera``).
    """

    camera: Camera
    cam_to_world: dict[str, np.ndarray]
    points: np.ndarray
    mean_reprojection_error: float
    registered: list[str]
    unregistered: list[str]
    model_sizes: list[int]
    seconds: dict[str, float] = field(default_factory=dict)
    cameras: dict[str, Camera] | None = None


def import_pycolmap() -> Any:
    """pycolmap, or a UserError that says how to install it."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        import pycolmap
    except ImportError as err:
        raise UserError(
            f"structure from motion needs pycolmap, which is not installed: {INSTALL_HINT}"
        ) from err
    if before is not None:
        # glog's failure handler (installed on import) took SIGTERM over at the C level: hand it back
        signal.signal(signal.SIGTERM, before)
    return pycolmap


def num_pairs(n_images: int, matcher: str, overlap: int = 10) -> int:
    """Image pairs the matcher verifies: all pairs, or COLMAP's sequential ones (successors and 2^k-th)."""
    if matcher == "exhaustive":
        return n_images * (n_images - 1) // 2
    pairs = set()
    for i in range(n_images):
        for k in range(overlap):
            for j in (i + 1 + k, i + (1 << k)):
                if j < n_images:
                    pairs.add((i, j))
    return len(pairs)


def _create_database(database: Path) -> None:
    """An empty SQLite file in write-ahead-log mode, before pycolmap opens it: readers then never
    block COLMAP's writer, which aborts on a busy database. The mode is stored in the file and kept
    by COLMAP, which creates its tables on first open. (Python's SQLite touches the file only here,
    while no other connection is open.)"""
    con = sqlite3.connect(database)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


@contextlib.contextmanager
def _quiet_stderr(quiet: bool):
    """Silence file descriptor 2 (C++ log lines that pycolmap's own log level does not reach)."""
    if not quiet:
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _counter(db: Any, what: str) -> Callable[[], int | None]:
    """``db.<what>()`` of an open pycolmap Database, None when it fails (busy right now)."""

    def count() -> int | None:
        try:
            return int(getattr(db, what)())
        except (RuntimeError, ValueError):
            return None

    return count


def _run_step(
    pycolmap: Any, fn: Callable[[Any], Any], poll: Callable[[], int | None], report: Callable[[int], None]
) -> Any:
    """``fn(cancellation_token)`` in a worker thread; ``report(poll())`` four times a second meanwhile."""
    token = pycolmap.CancellationToken()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = fn(token)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = err

    worker = threading.Thread(target=work, name="pycolmap", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(timeout=0.25)
            done = poll()
            if done is not None:
                report(done)
    except BaseException:  # Ctrl-C, SIGTERM (the app's handler raises): stop COLMAP, then unwind
        token.cancel()
        worker.join(timeout=CANCEL_WAIT_S)  # a step checks its token between images / pairs / models
        raise
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _camera(cam: Any) -> Camera:
    p = [float(v) for v in cam.params]
    name = cam.model.name
    size = {"width": int(cam.width), "height": int(cam.height)}
    #: COLMAP's parameter order per model (``src/colmap/sensor/models.h``)
    if name == "SIMPLE_PINHOLE":
        intr = Intrinsics(fx=p[0], fy=p[0], cx=p[1], cy=p[2], **size)
    elif name == "PINHOLE":
        intr = Intrinsics(fx=p[0], fy=p[1], cx=p[2], cy=p[3], **size)
    elif name == "SIMPLE_RADIAL":
        intr = Intrinsics(fx=p[0], fy=p[0], cx=p[1], cy=p[2], k1=p[3], model="opencv", **size)
    elif name == "RADIAL":
        intr = Intrinsics(fx=p[0], fy=p[0], cx=p[1], cy=p[2], k1=p[3], k2=p[4], model="opencv", **size)
    elif name == "OPENCV":
        intr = Intrinsics(
            fx=p[0], fy=p[1], cx=p[2], cy=p[3], k1=p[4], k2=p[5], p1=p[6], p2=p[7], model="opencv", **size
        )
    else:
        raise ValueError(f"unsupported camera model {name}")
    return Camera(name, intr)


def _cam_to_world(image: Any) -> np.ndarray:
    cam_from_world = image.cam_from_world
    if callable(cam_from_world):  # a method since pycolmap 3.12 (poses live on frames)
        cam_from_world = cam_from_world()
    m = np.eye(4)
    m[:3, :4] = np.asarray(cam_from_world.matrix(), dtype=np.float64)
    return np.linalg.inv(m)


def _extract(
    pycolmap: Any,
    db: Any,
    database: Path,
    image_dir: Path,
    names: list[str],
    options: SfmOptions,
    report: Progress,
) -> None:
    """Step 1: SIFT features of every image, one shared camera."""
    n = len(names)
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = options.camera_model
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.max_image_size = options.max_image_size
    extraction.num_threads = options.num_threads
    extraction.sift.max_num_features = options.max_num_features
    report("features", 0, n)
    _run_step(
        pycolmap,
        lambda token: pycolmap.extract_features(
            database,
            image_dir,
            image_names=names,
            camera_mode=pycolmap.CameraMode.SINGLE,
            reader_options=reader,
            extraction_options=extraction,
            cancellation_token=token,
        ),
        _counter(db, "num_images"),
        lambda done: report("features", done, n),
    )
    report("features", n, n)


def _match(pycolmap: Any, db: Any, database: Path, n: int, options: SfmOptions, report: Progress) -> None:
    """Step 2: exhaustive or sequential matching, each pair verified geometrically."""
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = options.num_threads
    matching.guided_matching = options.guided_matching
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = options.seed
    kwargs: dict[str, Any] = {"matching_options": matching, "verification_options": verification}
    if options.matcher == "exhaustive":
        matcher = pycolmap.match_exhaustive
    else:
        matcher = pycolmap.match_sequential
        pairing = pycolmap.SequentialPairingOptions()
        pairing.overlap = options.overlap
        pairing.quadratic_overlap = True
        kwargs["pairing_options"] = pairing
    total = num_pairs(n, options.matcher, options.overlap)
    report("matching", 0, total)
    _run_step(
        pycolmap,
        lambda token: matcher(database, cancellation_token=token, **kwargs),
        _counter(db, "num_verified_image_pairs"),
        lambda done: report("matching", min(done, total), total),
    )
    report("matching", total, total)


def run_sfm(
    image_dir: str | Path,
    names: list[str],
    work_dir: str | Path,
    options: SfmOptions,
    on_progress: Progress | None = None,
) -> SfmResult:
    """Reconstruct the images ``names`` of ``image_dir``; COLMAP's files go to ``work_dir``.

    ``work_dir`` receives ``database.db`` (features and matches) and ``sparse/0/`` (the kept model in
    COLMAP's binary format: cameras, images, points3D).

    Raises:
        UserError: pycolmap is missing, or no model could be made (the caller checks how many images
            the returned model registered).
    """
    pycolmap = import_pycolmap()
    image_dir, work_dir = Path(image_dir), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    database = work_dir / "database.db"
    report: Progress = on_progress or (lambda stage, done, total: None)
    n = len(names)
    pycolmap.logging.minloglevel = 0 if options.verbose else 2
    pycolmap.set_random_seed(options.seed)
    seconds: dict[str, float] = {}

    # 1-2. features and matching; their progress is read from the database they fill
    _create_database(database)
    db = pycolmap.Database.open(database)  # creates COLMAP's tables
    try:
        t0 = time.perf_counter()
        _extract(pycolmap, db, database, image_dir, names, options, report)
        seconds["features"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        _match(pycolmap, db, database, n, options, report)
        seconds["matching"] = time.perf_counter() - t0
    finally:
        db.close()

    # 3. mapping
    t0 = time.perf_counter()
    mapper = pycolmap.IncrementalPipelineOptions()
    mapper.num_threads = options.num_threads
    mapper.random_seed = options.seed
    # COLMAP discards a model of fewer images (its images may then start another): 10, its default,
    # for large captures; a small capture is one model of at least half its images
    mapper.min_model_size = min(10, max(3, n // 2))
    registered = [0]

    def on_pair() -> None:
        registered[0] += 2

    def on_image() -> None:
        registered[0] += 1

    models_dir = work_dir / "models"
    models_dir.mkdir(exist_ok=True)
    report("mapping", 0, n)
    models = _run_step(
        pycolmap,
        lambda token: pycolmap.incremental_mapping(
            database,
            image_dir,
            models_dir,
            options=mapper,
            initial_image_pair_callback=on_pair,
            next_image_callback=on_image,
            cancellation_token=token,
        ),
        lambda: min(registered[0], n),
        lambda done: report("mapping", done, n),
    )
    shutil.rmtree(models_dir, ignore_errors=True)
    seconds["mapping"] = time.perf_counter() - t0
    models = dict(models or {})
    if not models:
        raise UserError(
            f"structure from motion: no reconstruction: none of the {n} images could be put together "
            "(too few matching features between them); take photos with more overlap (each spot seen "
            "from 3+ views, small steps between views), with more texture in view, or try "
            "matcher=exhaustive"
        )
    report("mapping", n, n)
    rec = max(models.values(), key=lambda r: r.num_reg_images())

    # 4. bundle adjustment, with the principal point free
    if options.refine_principal_point:
        t0 = time.perf_counter()
        report("bundle adjustment", 0, 1)
        ba = pycolmap.BundleAdjustmentOptions()
        ba.refine_principal_point = True
        ba.print_summary = False
        with _quiet_stderr(not options.verbose):  # it logs its start whatever the log level
            _run_step(
                pycolmap,
                lambda token: pycolmap.bundle_adjustment(rec, ba, cancellation_token=token),
                lambda: None,
                lambda done: None,
            )
        pycolmap.logging.minloglevel = 0 if options.verbose else 2  # the adjustment resets it
        with contextlib.suppress(AttributeError):  # the points' errors after the adjustment
            rec.update_point_3d_errors()
        report("bundle adjustment", 1, 1)
        seconds["bundle adjustment"] = time.perf_counter() - t0

    sparse = work_dir / "sparse" / "0"
    sparse.mkdir(parents=True, exist_ok=True)
    rec.write(sparse)
    sizes = sorted((int(r.num_reg_images()) for r in models.values()), reverse=True)
    return result_of(rec, names, sizes, seconds)


def result_of(rec: Any, names: list[str], model_sizes: list[int], seconds: dict[str, float]) -> SfmResult:
    """The :class:`SfmResult` of a pycolmap ``Reconstruction`` of the images ``names`` (in this order):
    the poses of those it registered, its sparse points and their mean reprojection error.

    Raises:
        ValueError: a camera of a model :data:`CAMERA_MODELS` lacks.
    """
    poses = {img.name: _cam_to_world(img) for img in rec.images.values() if img.has_pose}
    points = np.array([p.xyz for p in rec.points3D.values()], dtype=np.float64).reshape(-1, 3)
    cameras = {cam_id: _camera(cam) for cam_id, cam in rec.cameras.items()}
    registered = [name for name in names if name in poses]
    of_image = {img.name: cameras[img.camera_id] for img in rec.images.values()}
    first = of_image[registered[0]] if registered else next(iter(cameras.values()))
    return SfmResult(
        camera=first,
        cam_to_world=poses,
        points=points,
        mean_reprojection_error=float(rec.compute_mean_reprojection_error()),
        registered=registered,
        unregistered=[name for name in names if name not in poses],
        model_sizes=model_sizes,
        seconds=seconds,
        cameras={n: of_image[n] for n in registered} if len(cameras) > 1 else None,
    )
