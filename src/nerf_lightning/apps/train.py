"""The train app: compose the config, instantiate everything, fit, validate, write metrics.json.

    python -m nerf_lightning.train [overrides]
    python -m nerf_lightning.train data.path=../shared/data/fox data.downscale=4
    python -m nerf_lightning.train strategy=ddp devices=4 precision=bf16-mixed
    python -m nerf_lightning.train -m model.net.field.encoding.log2_hashmap_size=15,17,19

Returns the value of ``optimized_metric`` (val/psnr) so Hydra sweepers can optimize it.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.apps.config_checks import check_config, check_devices
from nerf_lightning.apps.entry import hydra_app
from nerf_lightning.apps.fitting import Scores, fit_and_score
from nerf_lightning.callbacks.grad_exchange import Exchange, GradientExchange
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.data.refined import write_refined_capture
from nerf_lightning.errors import StopRun, UserError
from nerf_lightning.run.checkpoint_callbacks import RunState
from nerf_lightning.run.checkpoint_io import AtomicCheckpointIO, read_checkpoint
from nerf_lightning.run.divergence import DivergenceGuard
from nerf_lightning.run.elastic import restart_hazard
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.run.folder_guard import delete_old_run
from nerf_lightning.run.loop import QuietProfiler, drop_inert_callbacks, progress_bar
from nerf_lightning.run.model_node import instantiate_model
from nerf_lightning.run.resume import resolve_ckpt_path, select_run_dir
from nerf_lightning.run.resume_check import check_resumable, finished_note
from nerf_lightning.run.run_dir import rank_tag
from nerf_lightning.tracking.wandb_logger import finish_loggers
from nerf_lightning.training.clock import TrainingClock
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.utils.io import atomic_write_json

log = logging.getLogger("nerf_lightning.train")

#: the largest ``seed``: ``L.seed_everything`` seeds numpy's global generator, which takes 32 bits
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class TrainOptions:
    """The training config's own top-level keys (``conf/train.yaml``, where each is described); its
    nodes are checked against their ``_target_``. ``accumulate_grad_batches``, ``num_nodes`` and
    ``dist_timeout_s`` reach the Trainer and the strategy through interpolations."""

    seed: Annotated[int, Range(low=0, high=MAX_SEED), Note("numpy's seeds are 32-bit")]
    ckpt_path: str | None
    resume: Literal["never", "auto"]
    overwrite: bool
    grad_exchange: Exchange
    dist_timeout_s: Annotated[float, Range(above=0)]
    accumulate_grad_batches: Annotated[int, Range(low=1)]
    num_nodes: Annotated[int, Range(low=1)]


# Known-harmless noise: our step loader is an IterableDataset with __len__ (no workers), and a
# deprecation inside Lightning's own pytree helper.
warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")


def instantiate_group(group: DictConfig | None, **seams: Any) -> list[Any]:
    """Instantiate every ``_target_`` entry of a dict-of-configs group (callbacks, loggers).

    ``seams`` (e.g. ``feedback=datamodule.feedback``) go to each target whose constructor names them
    as parameters, and only to those."""
    if not group:
        return []
    nodes = [node for node in group.values() if node is not None and "_target_" in node]
    return [hydra.utils.instantiate(node, **_wanted(node._target_, seams)) for node in nodes]


def _wanted(target: str, seams: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``seams`` that ``target``'s signature takes by name."""
    if not seams:
        return {}
    parameters = inspect.signature(hydra.utils.get_object(target)).parameters
    return {name: value for name, value in seams.items() if name in parameters}


def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data, stored in every checkpoint (``hydra`` section dropped).

    ``data.path`` is made absolute (relative to the launch directory), so that eval/render/export
    find the capture from any working directory."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    data = plain.get("data")
    if isinstance(data, dict) and data.get("path"):
        root = Path(str(OmegaConf.select(cfg, "paths.root_dir", default=".") or "."))
        try:
            data["path"] = str((root / Path(str(data["path"])).expanduser()).resolve())
        except (RuntimeError, OSError) as err:  # a loop of links (RuntimeError before Python 3.13)
            raise UserError(
                f"data.path={data['path']}: a loop of symbolic links, which leads to no folder; expected a "
                "capture folder"
            ) from err
    return plain


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    """``cfg.data`` with the run's feedback: the training clock of ``cfg.batch_rule``, which the model
    shares through the same object (:func:`build_model`), and ``model.cuda_graph``, the one switch of
    the step's graphs and the batch draw's."""
    rule = hydra.utils.instantiate(cfg.batch_rule) if cfg.get("batch_rule") else None
    cuda_graph = OmegaConf.select(cfg, "model.cuda_graph", default="auto")
    feedback = TrainingFeedback(TrainingClock(rule))
    return hydra.utils.instantiate(cfg.data, feedback=feedback, cuda_graph=cuda_graph)


def build_model(cfg: DictConfig, datamodule: Any) -> tuple[L.LightningModule, dict[str, Any]]:
    """``cfg.model`` for the capture ``datamodule`` has set up, and the keyword arguments a checkpoint
    must store to rebuild it (eval, render and export build the same shapes from them).

    What the model takes from the capture: its box, and for the learned per-view poses / exposures the
    training views and their given poses (not stored: the state dict holds what the model keeps of
    them); the feedback it shares with the DataModule (the training clock of ``batch_rule``, where the
    step's per-ray losses and this rank's work share go). What the capture draws for
    the model: the training pixels' alpha when the model's opacity loss (``model.net.loss.alpha_weight``,
    ``auto``: renders only) is on (the model says so through the feedback).
    """
    model_kwargs = {
        "aabb_scale": datamodule.aabb_scale,
        "n_train_views": datamodule.n_train_views,
        "photograph": datamodule.is_photograph,
    }
    run_values = {**model_kwargs, "train_poses": datamodule.train_poses}
    model: L.LightningModule = instantiate_model(cfg.model, run_values, feedback=datamodule.feedback)
    opacity_loss = model.alpha_weight > 0
    configured = OmegaConf.select(cfg, "model.net.loss.alpha_weight")
    if configured == "auto":  # the choice and why, as setup logs the recipe's
        photo = datamodule.is_photograph
        why = "photographs: no transparent pixels" if photo else "renders: empty space charged"
        log.info("opacity loss: model.net.loss.alpha_weight=auto -> %g (%s)", model.alpha_weight, why)
    if opacity_loss and not datamodule.has_alpha:
        raise UserError(
            f"model.net.loss.alpha_weight={configured}: the training images of {cfg.data.path} carry no "
            "alpha channel, and the opacity loss needs one (RGBA renders); set model.net.loss.alpha_weight=0"
        )
    return model, model_kwargs


@dataclass(frozen=True)
class RunPlan:
    """What a training job was asked to do, once its config is checked: where it writes, what every
    checkpoint stores of its config, its own keys, and the checkpoint it resumes from (None: none)."""

    output_dir: Path
    plain_config: dict[str, Any]
    opts: TrainOptions
    ckpt_path: str | None


def prepare_run(cfg: DictConfig) -> tuple[RunPlan, dict[str, Any] | None]:
    """Check the config (before the data loads), find the checkpoint to resume from and read it (its
    weights checked for NaN/inf first), seed everything. Returns the plan and the checkpoint read."""
    output_dir = Path(cfg.paths.output_dir)
    plain_config = run_config(cfg)  # resolves every value first: an unset one names its key here
    opts = check_config(cfg, TrainOptions, (check_devices,))  # types and ranges, before the data loads
    ckpt_path = resolve_ckpt_path(opts.ckpt_path, opts.resume, output_dir)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    elif opts.ckpt_path == "last":
        log.info("ckpt_path=last: no %s yet, starting from scratch", output_dir / "checkpoints" / "last.ckpt")
    if (hazard := restart_hazard()) is not None and rank_tag() is None:
        log.warning(hazard)
    # the weights are checked before anything else (NaN/inf: refused), and read once
    checkpoint = read_checkpoint(ckpt_path) if ckpt_path is not None else None
    L.seed_everything(opts.seed, workers=True)
    return RunPlan(output_dir, plain_config, opts, ckpt_path), checkpoint


def setup_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    """:func:`build_datamodule` with its capture read: the model's box (``aabb_scale``) comes from it."""
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    try:
        datamodule.setup("fit")
    except ValueError as err:  # data.* values the loaders reject (CaptureError is a UserError already)
        raise (err if isinstance(err, UserError) else UserError(f"data: {err}")) from err
    return datamodule


def finished_metrics(
    cfg: DictConfig, plan: RunPlan, checkpoint: dict[str, Any], model: L.LightningModule, datamodule: Any
) -> dict[str, float] | None:
    """Check that ``checkpoint`` resumes this run (``run/resume_check.py``); when it has already trained
    every step, say so and return the run's metrics.json (None: training goes on)."""
    setting = f"ckpt_path={plan.opts.ckpt_path}" if plan.opts.ckpt_path else f"resume={plan.opts.resume}"
    check_resumable(setting, plan.ckpt_path, checkpoint, model, datamodule, plan.plain_config)
    if done := finished_note(checkpoint, cfg.trainer.max_steps, plan.output_dir):
        if rank_tag() is None:
            print(done, file=sys.stderr, flush=True)
        return json.loads((plan.output_dir / "metrics.json").read_text())
    return None


def build_callbacks(
    cfg: DictConfig,
    plan: RunPlan,
    datamodule: Any,
    model_kwargs: dict[str, Any],
    extra_callbacks: list[L.Callback] | None,
) -> list[L.Callback]:
    """The configured callbacks, ``extra_callbacks``, and the ones always on."""
    # the callbacks that read the sampler or the capture take the same feedback at construction
    callbacks = instantiate_group(cfg.get("callbacks"), feedback=datamodule.feedback)
    callbacks += extra_callbacks or []
    # Always on: the run's config and exact-resume state go into every checkpoint; the gradient exchange.
    callbacks.append(RunState(plan.plain_config, {"model": model_kwargs}, seed=plan.opts.seed))
    callbacks.append(GradientExchange(plan.opts.grad_exchange, datamodule.feedback))
    callbacks.append(DivergenceGuard())  # NaN/inf loss or weights: stop, never checkpoint them
    return callbacks


def build_trainer(
    cfg: DictConfig, callbacks: list[L.Callback], loggers: list[Any]
) -> tuple[L.Trainer, list[L.Callback], AtomicCheckpointIO]:
    """``cfg.trainer`` with the run's callbacks, loggers and plugins. Returns the trainer, the callbacks
    it was given (the progress bar settled) and its checkpoint writer."""
    # cluster=slurm|torchelastic|...: the ClusterEnvironment plugin (none: Lightning detects it)
    cluster = [hydra.utils.instantiate(cfg.cluster)] if cfg.get("cluster") else []
    # run/loop.py: what Lightning would do around every step for nothing (its own progress bar when the
    # callbacks group has none, a generator context per hook call, callbacks inert in this run)
    quiet = {} if cfg.trainer.get("profiler") else {"profiler": QuietProfiler()}
    callbacks, bar = progress_bar(callbacks, bool(cfg.trainer.get("enable_progress_bar", True)))
    checkpoint_io = AtomicCheckpointIO()
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[checkpoint_io, *cluster],
        enable_progress_bar=bar,
        **quiet,
    )
    drop_inert_callbacks(trainer)
    return trainer, callbacks, checkpoint_io


def collect_metrics(
    metrics: dict[str, float],
    scores: Scores,
    callbacks: list[L.Callback],
    model: L.LightningModule,
    trainer: L.Trainer,
) -> None:
    """Fill ``metrics`` (in place: what was gathered before a failing ``summary`` still reaches the
    loggers) with the validation, the final evaluation, every callback's ``summary()``, the batch rule,
    the steps and wall time, the occupancy and the per-view parameters."""
    metrics.update({k: float(v) for k, v in (scores.results[0] if scores.results else {}).items()})
    metrics.update(scores.evaluation)
    for cb in callbacks:
        summary = getattr(cb, "summary", None)
        if callable(summary):
            metrics.update(summary())
    metrics.update(model.clock.summary())  # the batch rule the run trained under
    metrics["steps"] = trainer.global_step  # also when a resumed run had nothing left to train
    metrics["time/wall_s"] = scores.wall_s
    metrics["model/occupied_fraction"] = float(model.occupancy.occupied_fraction())
    metrics.update(model.view_summary())


def write_refined_poses(
    trainer: L.Trainer, model: L.LightningModule, datamodule: Any, output_dir: Path
) -> None:
    """With learned camera poses (``model.net.camera_opt``), the capture with its refined training poses
    under ``<run>/refined`` (rank 0 only)."""
    if model.camera_opt is not None and trainer.is_global_zero:
        refined = write_refined_capture(
            datamodule.capture,
            datamodule.resolve_path(),
            model.camera_opt.refined_poses(datamodule.train_poses).cpu().numpy(),
            output_dir / "refined",
        )
        log.info("refined training poses: %s (train on them with data.path=%s)", refined, refined.parent)


def report(metrics: dict[str, float], output_dir: Path) -> None:
    """The run's result in the log and on stdout: validation and final-evaluation PSNR, the run dir."""
    log.info(
        "val/psnr %.2f dB  val/ssim %.4f  final evaluation (%s): %.2f dB  (%d steps, %.0f s training)",
        metrics.get("val/psnr", float("nan")),
        metrics.get("val/ssim", float("nan")),
        metrics.get("eval/split", "?"),
        metrics.get("eval/psnr", float("nan")),
        metrics["steps"],
        metrics.get("time/train_s", metrics["time/wall_s"]),
    )
    print(f"val/psnr: {metrics.get('val/psnr', float('nan')):.2f} dB")
    if metrics.get("eval/split") == "test":  # eval/*: also when the test split is the val views
        print(f"test/psnr: {metrics.get('eval/psnr', float('nan')):.2f} dB")
    print(f"run dir: {output_dir}")


def train(cfg: DictConfig, extra_callbacks: list[L.Callback] | None = None) -> dict[str, float]:
    """Run one training job described by ``cfg``; returns the final metrics (also in metrics.json).

    ``extra_callbacks`` (benchmarks, tests) are added to the configured ones.

    Raises:
        UserError: a bad config value (checked before the data loads), capture or checkpoint (checked
            before the run folder is written: ``run/folder_commit.py``).
        Diverged: the loss or the weights became NaN/inf (no checkpoint of that state is written).
        Interrupted: SIGTERM (or SIGHUP: :class:`~nerf_lightning.errors.HungUp`) stopped training
            (``last.ckpt`` was written at that step first).
    """
    plan, checkpoint = prepare_run(cfg)
    datamodule = setup_datamodule(cfg)
    model, model_kwargs = build_model(cfg, datamodule)
    if checkpoint is not None:  # trainer.fit loads the same again, once the run folder is written
        if (done := finished_metrics(cfg, plan, checkpoint, model, datamodule)) is not None:
            return done
    callbacks = build_callbacks(cfg, plan, datamodule, model_kwargs, extra_callbacks)
    loggers = instantiate_group(cfg.get("logger"))
    trainer, callbacks, checkpoint_io = build_trainer(cfg, callbacks, loggers)
    # every check has passed: from here on the run writes into its folder
    if plan.opts.overwrite and rank_tag() is None:
        delete_old_run(plan.output_dir)
    commit_run_folder()
    if checkpoint is not None:
        checkpoint_io.hand_over(plan.ckpt_path, checkpoint)
        del checkpoint
    metrics: dict[str, float] = {}
    exit_code = 1
    try:  # a W&B run is closed even when training fails, so the next multirun job gets its own run
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))  # the resolved Hydra config
        scores = fit_and_score(trainer, model, datamodule, plan.ckpt_path)
        if isinstance(scores, StopRun):
            exit_code = scores.exit_code
            raise scores from None
        collect_metrics(metrics, scores, callbacks, model, trainer)
        write_refined_poses(trainer, model, datamodule, plan.output_dir)
        exit_code = 0
    finally:
        finish_loggers(loggers, metrics, exit_code=exit_code)
    if trainer.is_global_zero:
        atomic_write_json(plan.output_dir / "metrics.json", metrics)
        report(metrics, plan.output_dir)
    return metrics


def with_device_preset(argv: list[str], has_cuda: bool) -> list[str]:
    """Add ``experiment=cpu`` when there is no CUDA GPU and the user picked no experiment.

    instant-ngp's defaults assume a GPU; on a CPU they would take hours. The CPU preset keeps the
    same scene and pipeline with a smaller grid and coarser marching. ``experiment=null`` opts out.
    """
    if "experiment=null" in argv:  # the default already: Hydra refuses null for a config group
        return [a for a in argv if a != "experiment=null"]
    if has_cuda or any(a.lstrip("+~").startswith(("experiment=", "hparams_search=")) for a in argv):
        return argv
    if any(a in ("--help", "-h", "--hydra-help", "--info") for a in argv):
        return argv
    print(
        "[nerf_lightning] no CUDA GPU: using the CPU preset (experiment=cpu) (experiment=null: off)",
        file=sys.stderr,
    )
    return [*argv, "experiment=cpu"]  # after the user's args: before `-m` Hydra would reject them


_MULTIRUN_FLAGS = ("-m", "--multirun")


def with_resume_dir(argv: list[str]) -> list[str]:
    """``resume=auto`` on a single run whose folder Hydra would choose: point ``hydra.run.dir`` at the
    newest earlier run with the same overrides (see ``run/resume.py``), so it continues there."""
    if "resume=auto" not in argv or any(a in _MULTIRUN_FLAGS for a in argv):
        return argv
    if any(a.lstrip("+~").startswith(("hydra.run.dir=", "hydra.mode=", "hparams_search=")) for a in argv):
        return argv  # a fixed folder (resumed in train()) or a sweep (each job resumes its own folder)
    if any(a in ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c") for a in argv):
        return argv
    try:
        found, message = select_run_dir(argv)
    except Exception:  # noqa: BLE001 - a config that does not compose: Hydra reports it properly next
        return argv
    print(f"[nerf_lightning] {message}", file=sys.stderr)
    return argv if found is None else [*argv, f"hydra.run.dir='{found}'"]


def prepare_argv(argv: list[str]) -> list[str]:
    """The train app's own rewrite of its command line: the CPU preset, ``resume=auto``'s run folder."""
    return with_resume_dir(with_device_preset(argv, torch.cuda.is_available()))


def train_and_score(cfg: DictConfig) -> float | None:
    """:func:`train`; returns the value of ``optimized_metric`` (what a Hydra sweeper optimizes)."""
    if cfg.get("print_config", False):
        print(OmegaConf.to_yaml(cfg, resolve=True))
    metrics = train(cfg)
    value = metrics.get(cfg.get("optimized_metric") or "")
    return float(value) if value is not None else None


main = hydra_app("train", train_and_score, open_nodes=(), prepare_argv=prepare_argv)

if __name__ == "__main__":
    main()
