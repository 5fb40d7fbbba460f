"""Which checkpoint a training run continues from: ``ckpt_path=...`` and ``resume=auto``.

``ckpt_path``: a ``.ckpt`` file, a run folder (its ``checkpoints/last.ckpt``) or ``last`` (this
run's own ``<run>/checkpoints/last.ckpt``; a fresh start when there is none yet).

``resume=auto`` (for jobs restarted blindly: SLURM requeue, preemptible machines) continues the
newest *matching* earlier run, in its own folder:

- When the run folder is fixed (``hydra.run.dir=...``, or a multirun job under a fixed
  ``hydra.sweep.dir``), that folder is the run: its ``checkpoints/last.ckpt`` is resumed when it
  exists, else training starts from scratch there.
- Otherwise Hydra would create a new timestamped folder (``outputs/runs/<task_name>/<date>_<time>``).
  Instead, :func:`select_run_dir` looks at the folders next to it (same parent,
  ``outputs/runs/<task_name>/``) and picks the newest one whose recorded command-line overrides
  (``.hydra/overrides.yaml``) equal this command's, ignoring ``resume`` and ``ckpt_path``; the run
  continues in that folder (``hydra.run.dir`` is set to it). A folder with a checkpoint wins over a newer
  one without (a run that died before its first checkpoint would otherwise restart from step 0 what an
  older folder had trained). No match: a new run starts as usual.

A ``checkpoints/last.ckpt`` that is there but no file (a folder, say) is refused before training
(:func:`resolve_ckpt_path`): the run would start from scratch and fail at its first checkpoint write.

"The same output folder" is therefore: same launch directory (relative ``outputs/``), same
``task_name``, same overrides. Two identical commands running *at the same time* would pick the
same folder: give concurrent jobs distinct overrides (``seed=``, ``tags=``) or ``hydra.run.dir``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from nerf_lightning.errors import UserError

__all__ = ["IGNORED_KEYS", "find_matching_run", "resolve_ckpt_path", "select_run_dir"]

#: overrides that do not make a run different (how it was started, not what it trains)
IGNORED_KEYS = ("resume", "ckpt_path")
LAST = Path("checkpoints") / "last.ckpt"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def comparable(overrides: Sequence[str]) -> list[str]:
    """Overrides that define the run (sorted; ``resume``, ``ckpt_path`` and ``hydra.*`` dropped)."""
    return sorted(o for o in overrides if _key(o) not in IGNORED_KEYS and not _key(o).startswith("hydra."))


def find_matching_run(parent: Path, overrides: Sequence[str]) -> Path | None:
    """The folder under ``parent`` whose ``.hydra/overrides.yaml`` matches ``overrides``: the newest that
    holds ``checkpoints/last.ckpt``, else the newest.

    "Newest" is by the modification time of that file (the run rewrites it when it is resumed in
    place, so a resumed run stays the newest).
    """
    want = comparable(overrides)
    best: tuple[bool, float, Path] | None = None
    for ov_file in Path(parent).glob("*/.hydra/overrides.yaml"):
        try:
            recorded = [str(o) for o in (OmegaConf.load(ov_file) or [])]
        except Exception:  # noqa: BLE001 - a half-written folder of a killed run is not a candidate
            continue
        if comparable(recorded) != want:
            continue
        folder = ov_file.parent.parent
        rank = ((folder / LAST).is_file(), ov_file.stat().st_mtime, folder)
        if best is None or rank[:2] > best[:2]:
            best = rank
    return best[2] if best else None


def select_run_dir(argv: Sequence[str], config_name: str = "train") -> tuple[Path | None, str]:
    """For ``resume=auto`` with a Hydra-chosen (timestamped) run folder: the earlier run to continue.

    Returns ``(folder or None, one-line explanation)``. Composes the config (without running it) to
    learn where this command's run folder would go.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.run.config import CONF_DIR
    from nerf_lightning.run.run_dir import register_resolvers

    register_resolvers()
    overrides = [a for a in argv if not a.startswith("-")]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
            run_dir = Path(str(OmegaConf.select(cfg, "hydra.run.dir")))
    finally:
        GlobalHydra.instance().clear()
    if run_dir.is_dir():  # a launcher-given run id (SLURM job, torchrun rendezvous): already its own folder
        return None, f"resume=auto: continuing this job's own folder {run_dir}"
    parent = run_dir.parent
    found = find_matching_run(parent, overrides)
    if found is None:
        return None, f"resume=auto: no earlier run with these overrides under {parent}/: starting a new run"
    found = found.resolve()
    last = found / LAST
    what = f"from {last}" if last.is_file() else "from scratch (it has no checkpoint yet)"
    return found, f"resume=auto: continuing {found} {what}"


def resolve_ckpt_path(ckpt_path: str | None, resume: str, output_dir: Path) -> str | None:
    """The checkpoint ``trainer.fit`` resumes from (None: a fresh start).

    Raises:
        UserError: ``ckpt_path`` names a file or folder that does not exist, or ``resume`` is unknown.
    """
    if resume not in ("never", "auto"):
        raise UserError(f"resume={resume!r}: expected `never` or `auto`")
    own = output_dir / LAST
    if own.exists() and not own.is_file():  # the first checkpoint write would fail, after training
        raise UserError(
            f"{own}: is a {'folder' if own.is_dir() else 'special file'}, not a checkpoint file; this run "
            "writes its checkpoint there: move it away, or choose another hydra.run.dir"
        )
    if ckpt_path in (None, "", "null"):
        if resume == "auto" and (output_dir / LAST).is_file():
            return str(output_dir / LAST)
        return None
    if ckpt_path == "last":
        last = output_dir / LAST
        return str(last) if last.is_file() else None
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        path = path / LAST if (path / LAST).is_file() else path / "last.ckpt"
    if not path.is_file():
        raise UserError(
            f"ckpt_path={ckpt_path}: no such checkpoint; expected a .ckpt file or a run folder with "
            f"{LAST} (or ckpt_path=last / resume=auto to continue this run's own)"
        )
    return str(path)
