"""Hydra app: a folder of photos or a phone video -> a capture the trainer reads (``conf/process.yaml``).

    python -m nerf_lightning.process images=/path/to/photos out=/path/to/capture
    python -m nerf_lightning.process video=/path/to/clip.mp4 out=/path/to/capture num_frames=150
    python -m nerf_lightning.process colmap=/path/to/sparse/0 images=/path/to/photos out=/path/to/capture
    python -m nerf_lightning.process images=/path/to/photos masks=/path/to/masks out=/path/to/capture
    python -m nerf_lightning.train data.path=/path/to/capture

Stages, each with a progress bar: the images (photos copied, or about ``num_frames`` of the sharpest
video frames extracted), then structure from motion with pycolmap (features, matching, mapping,
bundle adjustment; ``capture/sfm.py``), then the poses oriented, centred and scaled as instant-ngp's
``colmap2nerf.py`` does it (``capture/normalize.py``) and written as an instant-ngp
``transforms.json`` (``capture/transforms.py``). With ``colmap=MODEL`` the poses come from a COLMAP
model someone already solved (``capture/colmap_model.py``) instead of a solve, and go through the same
normalization and writer; ``masks=FOLDER`` adds masks of what moved (``capture/mask_import.py``).

``out`` receives ``images/``, ``transforms.json``, ``process.json`` (the summary below, the options
and the time of each stage) and ``colmap/sparse/0/`` (COLMAP's model; ``colmap/database.db`` too with
``keep_database=true``). It is built in a temporary folder next to ``out`` and renamed into place
when complete: a run that fails or is interrupted leaves ``out`` as it was (Ctrl-C and SIGTERM end it
with one line, exit status 130 and 143). The solve runs in a child process that an interruption kills
(``capture/sfm_child.py``); the build folder left by a run killed with SIGKILL is removed by the next
run into the same ``out`` (``capture/build_folder.py``).

The summary at the end: how many images got a pose (registered, X of Y) and which did not (a
warning lists them: they are left out of ``transforms.json``), the mean reprojection error of the
sparse points (pixels; well under 1 px for a sharp capture), how far the cameras are from the scene
centre and the box they span, and the ``aabb_scale`` chosen.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.apps.entry import hydra_app
from nerf_lightning.capture.baseline import distinct_views
from nerf_lightning.capture.build_folder import building, remove_stale_builds
from nerf_lightning.capture.colmap_model import model_folder, read_colmap_model, scaled_result
from nerf_lightning.capture.mask_import import find_masks, write_masks
from nerf_lightning.capture.normalize import AABB_COVERAGE, MAX_AABB_SCALE, normalization, suggest_aabb_scale
from nerf_lightning.capture.photos import import_photos, list_photos
from nerf_lightning.capture.sfm import STAGES, SfmOptions, SfmResult, import_pycolmap
from nerf_lightning.capture.sfm_child import run_sfm_in_child as run_sfm
from nerf_lightning.capture.transforms import TransformFrame, transforms_doc, write_transforms
from nerf_lightning.capture.video_frames import extract_frames
from nerf_lightning.data.poses import NGP_DEFAULT_SCALE
from nerf_lightning.errors import UserError, io_error_line, is_io_error, written_file
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.utils.io import atomic_directory, atomic_write_json

log = logging.getLogger("nerf_lightning.process")

MIN_IMAGES = 3


class StageBars:
    """One rich progress bar per stage, added when the stage first reports (``(stage, done, total)``)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=max(total, 1))
        self.progress.update(self.tasks[stage], completed=done, total=max(total, 1))


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:>18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


def _source(cfg: DictConfig) -> tuple[str, Path]:
    images, video = cfg.get("images"), cfg.get("video")
    if (images is None) == (video is None):
        both = "both" if images is not None else "neither"
        raise UserError(
            f"{both} of images= and video= given: pass exactly one (images=/path/to/photos or "
            "video=/path/to/clip.mp4)"
        )
    kind = "images" if images is not None else "video"
    return kind, Path(str(images if images is not None else video)).expanduser()


def _colmap(cfg: DictConfig, kind: str) -> Path | None:
    colmap = cfg.get("colmap")
    if colmap is None:
        return None
    if kind != "images":
        raise UserError("colmap= goes with images= (the folder of the model's images), not with video=")
    return Path(str(colmap)).expanduser()


def _masks(cfg: DictConfig, kind: str, source: Path) -> dict[str, tuple[Path, str]]:
    """The masks of the photos of ``source``: from ``masks=``, else instant-ngp's beside the photos."""
    folder = cfg.get("masks")
    if folder is not None and kind != "images":
        raise UserError("masks= goes with images= (masks named after the photos), not with video=")
    if kind != "images":
        return {}
    if folder is None:
        if not any(source.glob("dynamic_mask_*.png")):
            return {}
        folder = source  # instant-ngp's layout: dynamic_mask_<stem>.png beside each photo
    return find_masks(Path(str(folder)).expanduser(), list_photos(source))


def _check_camera_sizes(result: SfmResult, photos: list[Any]) -> None:
    for photo in photos:
        cam = (result.cameras or {}).get(photo.name, result.camera).intrinsics
        if (cam.width, cam.height) != (photo.width, photo.height):
            raise UserError(
                f"images={photo.source.parent}: {photo.name} is {photo.width}x{photo.height} but its camera "
                f"in the COLMAP model is for {cam.width}x{cam.height} images; pass the images the model was "
                "solved from"
            )


def _check_out(out: Path, overwrite: bool, source: Path) -> None:
    """Refuse early what the final rename would refuse (or what would destroy the input)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"out={out}: is a file; expected a folder to write the capture into")
    src, dst = source.resolve(), out.resolve()
    if src == dst or dst in src.parents:
        raise UserError(
            f"out={out}: holds the input {source}; write the capture to another folder "
            "(it is built next to `out` and replaces it)"
        )
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"out={out}: exists and is not empty; choose another folder or pass overwrite=true")
    # the capture is built in a hidden folder next to `out`: its parent, or what exists of it, must take files
    base = next(p for p in (out.parent, *out.parent.parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        cause = (err.strerror or str(err)).lower()
        raise UserError(
            f"out={out}: cannot write there ({cause}); choose a folder you can write (out=...)"
        ) from err


def _as_written(err: OSError, build: Path | None, out: Path) -> UserError:
    """A failed write into the build folder, naming the file as ``out`` will hold it (``out/images/x.jpg``,
    not the hidden build folder, nor the photo a copy read) and the key that moves it (``out=``)."""
    written, where = written_file(err), None
    if build is not None and written is not None:
        path = Path(written)
        where = str(out / path.relative_to(build)) if path.is_relative_to(build) else written
    return UserError(io_error_line(err, "out", where))


def _options(cfg: DictConfig, kind: str, n_photos: int) -> SfmOptions:
    matcher = str(cfg.matcher)
    if matcher == "auto":
        sequential = kind == "video" or n_photos > int(cfg.exhaustive_max_images)
        matcher = "sequential" if sequential else "exhaustive"
    sfm = OmegaConf.to_container(cfg.sfm, resolve=True)
    assert isinstance(sfm, dict)
    return SfmOptions(matcher=matcher, camera_model=str(cfg.camera_model).upper(), **sfm)


def _aabb_choice(value: Any) -> int | None:
    if str(value) == "auto":
        return None
    try:
        a = int(value)
    except (TypeError, ValueError):
        a = 0
    if a < 1 or a > MAX_AABB_SCALE or a & (a - 1):
        raise UserError(f"aabb_scale={value}: expected auto or a power of two from 1 to {MAX_AABB_SCALE}")
    return a


def _check_values(cfg: DictConfig) -> None:
    if not isinstance(cfg.downscale, int) or cfg.downscale < 1:
        raise UserError(f"downscale={cfg.downscale}: expected an integer >= 1")
    if not isinstance(cfg.num_frames, int) or cfg.num_frames < MIN_IMAGES:
        raise UserError(f"num_frames={cfg.num_frames}: expected an integer >= {MIN_IMAGES}")
    if not 0.0 <= float(cfg.min_registered) <= 1.0:
        raise UserError(f"min_registered={cfg.min_registered}: expected a share from 0 to 1")
    if str(cfg.matcher) not in ("auto", "exhaustive", "sequential"):
        raise UserError(f"matcher={cfg.matcher}: expected auto, exhaustive or sequential")


def _check_baseline(kind: str, source: Path, image_dir: Path, names: list[str]) -> None:
    """Refuse images that show fewer than :data:`MIN_IMAGES` different views (the camera never moved):
    no baseline to triangulate from, whatever the features."""
    groups = distinct_views([image_dir / n for n in names])
    if len(groups) >= MIN_IMAGES:
        return
    what = "photos" if kind == "images" else "frames of the video"
    same = ", ".join(f"{g[0].name} = {len(g)} images" for g in groups[:3])
    raise UserError(
        f"{kind}={source}: the {len(names)} {what} show only {len(groups)} distinct view(s) ({same}): the "
        "camera never moved, so there is no baseline between the views to triangulate from; take the "
        f"photos from different positions (a step around the object between shots, at least {MIN_IMAGES})"
    )


def _too_few_registered(result: SfmResult, n: int, options: SfmOptions, min_share: float) -> UserError | None:
    got = len(result.registered)
    if got >= MIN_IMAGES and got >= min_share * n:
        return None
    advice = (
        "try matcher=exhaustive, or take the frames with more overlap"
        if options.matcher == "sequential"
        else "take photos with more overlap (every spot in 3+ photos, small steps between them) and "
        "more texture in view"
    )
    return UserError(
        f"only {got} of {n} images registered (min_registered={min_share:g}, at least {MIN_IMAGES}): "
        f"{advice}; min_registered=0 keeps what registered"
    )


def process(cfg: DictConfig) -> dict[str, Any]:
    """Run the app described by ``cfg`` (``conf/process.yaml``); returns what ``process.json`` holds."""
    kind, source = _source(cfg)
    colmap = _colmap(cfg, kind)
    _check_values(cfg)
    aabb_choice = _aabb_choice(cfg.aabb_scale)
    out = Path(str(cfg.out)).expanduser()
    overwrite = bool(cfg.overwrite)
    _check_out(out, overwrite, source)
    model: SfmResult | None = None
    options: SfmOptions | None = None
    if colmap is not None:  # its poses: no structure from motion
        model, photos = read_colmap_model(colmap, source)
    else:
        photos = list_photos(source) if kind == "images" else []
        if kind == "images" and len(photos) < MIN_IMAGES:
            raise UserError(
                f"images={source}: {len(photos)} photo(s); structure from motion needs at least {MIN_IMAGES} "
                "(a few dozen around the object work best)"
            )
        options = _options(cfg, kind, len(photos))
    masks = _masks(cfg, kind, source)
    import_pycolmap()  # before anything is copied: the install hint is the first thing to fix
    commit_run_folder()  # every check has passed
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    source_info: dict[str, Any] = {kind: str(source)}
    if colmap is not None:
        source_info["colmap"] = str(colmap)
    build: Path | None = None
    try:
        remove_stale_builds(out)  # leftovers of an earlier run of this command that was killed
        with _progress() as progress, atomic_directory(out, overwrite=overwrite) as tmp, building(tmp):
            build = tmp
            bars = StageBars(progress)
            t0 = time.perf_counter()
            if kind == "images":
                imported = import_photos(
                    photos, tmp / "images", int(cfg.downscale), bool(cfg.link_images),
                    lambda done, total: bars("images", done, total), one_size=model is None,
                )  # fmt: skip
                names = [p.name for p in imported]
                sharp = {p.name: p.sharpness for p in imported}
            else:
                frames, info = extract_frames(
                    source, tmp / "images", int(cfg.num_frames), int(cfg.downscale),
                    lambda done, total: bars("video frames", done, total),
                )  # fmt: skip
                if len(frames) < MIN_IMAGES:
                    raise UserError(
                        f"video={source}: {len(frames)} frame(s); structure from motion needs at least "
                        f"{MIN_IMAGES}: use a longer clip"
                    )
                names = [f.name for f in frames]
                sharp = {f.name: f.sharpness for f in frames}
                source_info.update(fps=info.fps, duration_s=info.duration, frames_in_clip=info.n_frames)
                source_info["kept_frame_indices"] = [f.index for f in frames]
            seconds["images"] = time.perf_counter() - t0
            if model is not None:
                result = scaled_result(model, int(cfg.downscale))
                _check_camera_sizes(result, imported)
                shutil.copytree(model_folder(colmap), tmp / "colmap" / "sparse" / "0")  # type: ignore[arg-type]
            else:
                assert options is not None
                _check_baseline(kind, source, tmp / "images", names)
                result = run_sfm(tmp / "images", names, tmp / "colmap", options, bars)
                seconds.update(result.seconds)
                failure = _too_few_registered(result, len(names), options, float(cfg.min_registered))
                if failure is not None:
                    raise failure
            mask_paths = write_masks(masks, result.registered, tmp, int(cfg.downscale))
            summary = _write_capture(tmp, result, sharp, aabb_choice, options, source_info, mask_paths)
            if not cfg.keep_database:
                (tmp / "colmap" / "database.db").unlink(missing_ok=True)
            seconds["total"] = time.perf_counter() - started
            summary["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
            atomic_write_json(tmp / "process.json", summary)
    except FileExistsError as err:  # `out` was filled while this ran
        raise UserError(
            f"out={out}: exists and is not empty; choose another folder or pass overwrite=true"
        ) from err
    except OSError as err:  # a full disk, a folder that turned read-only
        if not is_io_error(err):
            raise
        raise _as_written(err, build, out) from err
    _print_summary(out, summary)
    return summary


def _write_capture(
    tmp: Path,
    result: SfmResult,
    sharp: dict[str, float],
    aabb_choice: int | None,
    options: SfmOptions | None,
    source_info: dict[str, Any],
    mask_paths: dict[str, str],
) -> dict[str, Any]:
    """transforms.json of the registered images (with their masks' ``mask_path``); returns the summary.
    ``options``: the solve's, None for a COLMAP model read as it is."""
    names = result.registered
    norm = normalization(np.stack([result.cam_to_world[n] for n in names]))
    poses = norm.poses(np.stack([result.cam_to_world[n] for n in names]))
    points = norm.points(result.points)
    suggested = suggest_aabb_scale(points)
    aabb = suggested if aabb_choice is None else aabb_choice
    cameras = result.cameras or {}
    frames = [
        TransformFrame(f"images/{n}", sharp[n], pose, cameras.get(n), mask_paths.get(n))
        for n, pose in zip(names, poses, strict=True)
    ]
    write_transforms(tmp / "transforms.json", transforms_doc(result.camera, frames, aabb))

    centres = poses[:, :3, 3]
    dist = np.linalg.norm(centres, axis=1)
    inside = 2.0 * NGP_DEFAULT_SCALE * np.abs(points).max(axis=1) <= aabb if len(points) else np.ones(0)
    return {
        "source": source_info,
        "images": len(names) + len(result.unregistered),
        "registered": len(names),
        "unregistered_images": result.unregistered,
        "model_sizes": result.model_sizes,
        "mean_reprojection_error_px": result.mean_reprojection_error,
        "points": len(points),
        "aabb_scale": aabb,
        "aabb_scale_suggested": suggested,
        "points_inside_aabb": float(inside.mean()) if len(points) else 1.0,
        "camera": {"model": result.camera.model, **result.camera.ngp_keys()},
        "camera_distance": {"min": float(dist.min()), "mean": float(dist.mean()), "max": float(dist.max())},
        "camera_extent": (centres.max(axis=0) - centres.min(axis=0)).tolist(),
        "colmap_to_capture": norm.matrix.tolist(),
        "masks": len(mask_paths),
        "options": dict(vars(options)) if options is not None else None,
        "pycolmap": getattr(import_pycolmap(), "__version__", "?"),
    }


def _print_summary(out: Path, s: dict[str, Any]) -> None:
    d, ext, sec = s["camera_distance"], s["camera_extent"], s["seconds"]
    steps = ", ".join(f"{k} {sec[k]:.1f} s" for k in STAGES if k in sec)
    sizes = s["model_sizes"]
    models = (
        ""
        if len(sizes) == 1
        else f"; {len(sizes)} separate models ({', '.join(map(str, sizes))}), the largest kept"
    )
    lines = [
        f"registered {s['registered']} of {s['images']} images{models}",
        f"mean reprojection error {s['mean_reprojection_error_px']:.3f} px over {s['points']} sparse points",
        f"cameras {d['min']:.2f}-{d['max']:.2f} from the scene centre (mean {d['mean']:.2f}; "
        f"{d['mean'] * NGP_DEFAULT_SCALE:.2f} NGP units), "
        f"spanning {ext[0]:.2f} x {ext[1]:.2f} x {ext[2]:.2f} (z up)",
        f"aabb_scale {s['aabb_scale']} (its box holds {100 * s['points_inside_aabb']:.0f} % of the sparse "
        f"points; suggested {s['aabb_scale_suggested']}, for {100 * AABB_COVERAGE:.0f} %)",
        f"structure from motion {sum(sec.get(k, 0.0) for k in STAGES):.1f} s ({steps})"
        if "colmap" not in s["source"]
        else f"poses read from the COLMAP model {s['source']['colmap']} (no structure from motion)",
        f"wrote {out / 'transforms.json'} ({s['registered']} frames) and {out / 'images'}/"
        + (f" ({s['masks']} masks in {out / 'masks'}/)" if s["masks"] else ""),
        f"next: python -m nerf_lightning.train data.path={out}",
    ]
    for line in lines:
        log.info(line)
    print("\n".join(lines), flush=True)
    missing = s["unregistered_images"]
    if missing:
        shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        warning = (
            f"warning: {len(missing)} of {s['images']} images did not register and are not in "
            f"transforms.json: {shown}"
        )
        log.warning(warning)
        print(warning, file=sys.stderr, flush=True)


main = hydra_app("process", process, open_nodes=(), stop_on_sigterm=True)  # SIGTERM: `out` untouched

if __name__ == "__main__":
    main()
