"""Hydra app: evaluate a trained checkpoint — metrics and one image per view.

    python -m nerf_lightning.eval ckpt=PATH [split=auto|val|test|train] [data.path=...] [data.KEY=...]

The model and the DataModule are rebuilt from the config stored in the checkpoint (with the
``data.*`` / ``model.*`` overrides given here) and the metrics come from the model's own validation
code (``trainer.validate``): eval reports exactly what training reports for the same views, whatever
strategy and precision the checkpoint was trained with (eval runs on one device, ``strategy=single``).

Writes into its run folder (``outputs/runs/eval/<date>_<time>/`` unless ``hydra.run.dir=...``):
``metrics.json`` (``<split>/psnr``, ``<split>/ssim``, ... as logged by the model, with
``<split>/psnr_fitted`` ... when the fair held-out protocol runs (``fit_heldout``, see
``models/heldout_fit.py``), plus ``views``: one entry per view with its image and PSNR; ``n_views`` of
the split's ``n_split_views``), ``views/<frame>.png`` (prediction) and ``views/<frame>_depth.png``
(expected depth, 16-bit, normalized per view; built in a hidden ``.views.tmp-*`` that goes into place
once every view is scored: one that an eval killed with SIGKILL left is removed by the next eval into the
folder, as ``process`` does, ``capture/build_folder.py``). ``split=auto`` and ``split=test`` score at most
``data.max_test_views`` views (evenly spaced), as the final evaluation of training does; ``val`` and
``train`` at most ``data.max_val_views``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import hydra
import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from nerf_lightning.apps.config_checks import check_config
from nerf_lightning.apps.entry import hydra_app, nested_overrides
from nerf_lightning.capture.build_folder import building, remove_stale_builds
from nerf_lightning.config_schema import Note
from nerf_lightning.data.capture_identity import capture_difference
from nerf_lightning.data.heldout import NoTestSplit, validation_frames
from nerf_lightning.errors import UserError
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.run.hangup import interruption, stop_signal
from nerf_lightning.run.restore import RestoredRun, load_run
from nerf_lightning.utils.io import atomic_directory, atomic_write_json

log = logging.getLogger("nerf_lightning.eval")


class ViewWriter(L.Callback):
    """Per-view outputs of a validation pass: prediction / depth PNGs and each view's PSNR.

    Reads what ``NeRFModule.validation_step`` returns (``rgb`` [H, W, 3], ``depth`` and ``opacity``
    [H, W]) and the batch's ground truth.
    """

    def __init__(self, out_dir: Path | None, names: list[str]) -> None:
        self.out_dir = out_dir
        self.names = names
        self.rows: list[dict[str, Any]] = []

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if outputs is None:  # a placeholder batch (a rank without a view of its own)
            return
        if not isinstance(outputs, dict) or "rgb" not in outputs:
            raise RuntimeError(
                "eval: the model's validation_step must return {'rgb': [H, W, 3], 'depth': ...}"
            )
        pred = outputs["rgb"].float().clamp(0, 1)
        h, w = pred.shape[:2]
        gt = batch["rgb"].reshape(h, w, 3).float()
        mse = float(((pred - gt) ** 2).mean())
        view = int(batch["view"])
        name = self.names[view] if view < len(self.names) else f"view{view:03d}"
        row: dict[str, Any] = {"view": view, "name": name, "psnr": -10.0 * float(np.log10(max(mse, 1e-10)))}
        if self.out_dir is not None:
            import imageio.v3 as iio

            self.out_dir.mkdir(parents=True, exist_ok=True)
            rgb8 = (pred.cpu().numpy() * 255).round().astype(np.uint8)
            iio.imwrite(self.out_dir / f"{name}.png", rgb8)
            depth = _expected_depth(outputs).cpu().numpy()
            hi = float(depth.max()) if depth.size else 0.0
            d16 = (depth / hi * 65535).round().astype(np.uint16) if hi > 0 else depth.astype(np.uint16)
            iio.imwrite(self.out_dir / f"{name}_depth.png", d16)
            row["image"] = f"views/{name}.png"
        self.rows.append(row)


def _expected_depth(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Depth along the ray where the opacity is > 0 (the renderer's depth is not divided by it)."""
    depth = outputs["depth"].float()
    opacity = outputs.get("opacity")
    if opacity is None:
        return depth
    return torch.where(opacity > 1e-3, depth / opacity.float().clamp_min(1e-3), torch.zeros_like(depth))


@dataclass(frozen=True)
class EvalOptions:
    """The evaluation's own keys (``conf/eval.yaml``, where each is described)."""

    split: Literal["auto", "val", "test", "train"]
    save_images: bool
    fit_heldout: Annotated[bool | Literal["auto"] | None, Note("null: as the run was trained")] = None
    allow_other_capture: Annotated[bool, Note("score a capture other than the checkpoint's")] = False


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run the evaluation described by ``cfg`` (see ``conf/eval.yaml``); returns what metrics.json holds."""
    opts = check_config(cfg, EvalOptions)
    split = opts.split
    out_dir = Path(cfg.paths.output_dir)
    run = load_run(cfg.ckpt)
    log.info("checkpoint %s (step %d)", run.path, run.global_step)

    data_overrides = nested_overrides(cfg.get("data"))
    data_overrides["val_split"] = split
    if split in ("auto", "test"):  # the final evaluation's views: as many as training scored
        data_overrides["max_val_views"] = run.node("data", data_overrides).get("max_test_views")
    datamodule = run.build_datamodule(data_overrides)
    datamodule.prepare_data()
    try:
        datamodule.setup("validate")
    except NoTestSplit as err:
        raise UserError(
            f"split={split}: {datamodule.resolve_path()}: the capture has no test split; use split=val for "
            "its held-out views"
        ) from err
    except ValueError as err:
        raise (err if isinstance(err, UserError) else UserError(f"data: {err}")) from err
    if not opts.allow_other_capture:
        check_same_capture(run, datamodule)
    val_set = getattr(datamodule, "val_set", None)
    if val_set is None or not val_set.frames:
        raise UserError(f"split={split}: the capture has no such views; try split=val or split=train")
    used = "test" if split == "auto" and datamodule.capture.test else ("val" if split == "auto" else split)
    n_split = len(validation_frames(datamodule.capture, split, datamodule.resolve_path()))
    shown = ", ".join(Path(f.image_path).name for f in val_set.frames)
    log.info("scoring %d of %d %s views: %s", len(val_set.frames), n_split, used, shown)

    model = run.build_model(nested_overrides(cfg.get("model")))
    if opts.fit_heldout is not None:
        model.fair_heldout.fit = dataclasses.replace(model.fair_heldout.fit, enabled=opts.fit_heldout)
    if "save_val_images" in model.hparams:
        model.hparams.save_val_images = False  # the writer below saves every view
    names = [Path(f.image_path).stem for f in val_set.frames]
    if len(set(names)) < len(names):  # same file names in different folders
        names = [f"{i:03d}_{n}" for i, n in enumerate(names)]
    commit_run_folder()  # every check has passed
    with contextlib.ExitStack() as stack:
        # the views are written aside and go into place once every view is scored
        views = None
        if opts.save_images:
            remove_stale_builds(out_dir / "views")  # what an eval killed here (kill -9) left
            views = stack.enter_context(atomic_directory(out_dir / "views", overwrite=True))
            stack.enter_context(building(views))
        writer = ViewWriter(views, names)
        callbacks = [hydra.utils.instantiate(c) for c in cfg.trainer.get("callbacks") or []]
        trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=[*callbacks, writer])
        try:
            results = trainer.validate(model, datamodule=datamodule, verbose=False)
        except SIGTERMException:  # Lightning's own handler stopped the loop
            raise interruption(
                f"eval stopped by {stop_signal()} before it finished; no metrics.json and no views/ were "
                f"written into {out_dir}: run the same command again"
            ) from None

    metrics = {_rename(k, used): float(v) for k, v in (results[0] if results else {}).items()}
    doc: dict[str, Any] = {
        **metrics,
        "split": used,
        "checkpoint": str(run.path),
        "step": run.global_step,
        "n_views": len(writer.rows),
        "n_split_views": n_split,
        "views": sorted(writer.rows, key=lambda r: r["view"]),
    }
    atomic_write_json(out_dir / "metrics.json", doc)
    shown = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    log.info("%s views of %s: %s", len(writer.rows), used, shown)
    print(f"{used}: {shown}")
    print(f"eval dir: {out_dir}")
    return doc


def check_same_capture(run: RestoredRun, datamodule: Any) -> None:
    """Refuse to score ``run``'s checkpoint on a capture other than the one it was trained on (its training
    views' names and sizes: ``data/capture_identity.py``); ``allow_other_capture=true`` lets it through."""
    state = run.checkpoint.get(type(datamodule).__qualname__)
    stored_downscale = int(run.node("data").get("downscale", 1) or 1)
    difference = capture_difference(state, datamodule.capture, datamodule.downscale, stored_downscale)
    if difference is not None:
        raise UserError(
            f"data.path={datamodule.resolve_path()}: not the capture {run.path} was trained on "
            f"({difference}); score the checkpoint on its own capture, or pass allow_other_capture=true to "
            "score this one anyway"
        )


def _rename(key: str, split: str) -> str:
    """``val/psnr`` -> ``<split>/psnr`` (the model logs every validation pass under ``val/``)."""
    return f"{split}/{key[4:]}" if key.startswith("val/") else key


main = hydra_app("eval", evaluate)

if __name__ == "__main__":
    main()
