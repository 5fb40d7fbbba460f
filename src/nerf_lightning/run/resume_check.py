"""Whether a training run can continue a checkpoint, decided before the run folder is touched.

``trainer.fit(ckpt_path=...)`` loads the checkpoint's weights and training-view state only once the run
has started writing into its folder, and a mismatch then reads as "its weights do not fit" whatever
differs. The train app checks first, on the model and DataModule it has just built:

- :func:`finished_note`: a run whose folder holds its ``metrics.json`` and whose checkpoint is at its end
  has nothing left to do; the app says so and writes nothing (exit status 0);
- :func:`check_resumable`: the checkpoint's weights and training-view state are loaded into the new model
  and DataModule (``trainer.fit`` loads the same again); a mismatch names what differs and the settings
  of this command that differ from the checkpoint's run (its stored config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from nerf_lightning.errors import UserError
from nerf_lightning.run.checkpoint_callbacks import CHECKPOINT_KEY
from nerf_lightning.run.restore import upgrade_stored_config

__all__ = ["check_resumable", "config_changes", "finished_note"]

#: the config sections whose values shape the weights and the training views
SHAPING = ("model", "data")
#: settings of those sections that say where caches go (under the launch folder), not what trains
CACHES = ("data.cache_dir", "data.scene_root")
#: differing settings a message lists at most
SHOWN = 3


def finished_note(checkpoint: dict[str, Any], max_steps: int | None, output_dir: Path) -> str | None:
    """The line that says the run in ``output_dir`` is finished and nothing is done, or None when there is
    work left: its ``metrics.json`` exists and ``checkpoint`` has trained ``max_steps`` reference steps
    (its training clock's position: the optimizer steps, or fewer under a batch rule that counts rays)."""
    metrics = output_dir / "metrics.json"
    if not max_steps or max_steps < 0 or not metrics.is_file():
        return None
    step = int(checkpoint.get("global_step", 0))
    clock = checkpoint.get("training_clock")
    position = float(clock.get("position", step)) if isinstance(clock, dict) else float(step)
    if position < max_steps - 1e-6:
        return None
    return (
        f"{output_dir}: this run already finished at step {step} (trainer.max_steps={max_steps}; {metrics}); "
        "nothing was trained or written: raise trainer.max_steps to train it further, or score it again "
        f"with python -m nerf_lightning.eval ckpt={output_dir}"
    )


def check_resumable(
    setting: str,
    path: str | Path,
    checkpoint: dict[str, Any],
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    run_config: dict[str, Any],
) -> None:
    """Load ``checkpoint``'s weights into ``model`` and its training-view state into ``datamodule``.

    Raises:
        UserError: they do not fit; ``{setting}: {path}: ...`` (``setting``: ``ckpt_path=last``,
            ``resume=auto``) names what differs and this command's settings that differ from the
            checkpoint's run.
    """
    try:
        model.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as err:
        raise UserError(_mismatch(setting, path, "its weights do not fit this run's model", err, checkpoint,
                                  run_config)) from err  # fmt: skip
    state = checkpoint.get(type(datamodule).__qualname__)
    if state is None or not hasattr(datamodule, "load_state_dict"):
        return
    try:
        datamodule.load_state_dict(state)
    except RuntimeError as err:
        raise UserError(_mismatch(setting, path, "its training views differ from this run's", err, checkpoint,
                                  run_config)) from err  # fmt: skip


def _mismatch(
    setting: str, path: str | Path, what: str, err: RuntimeError, checkpoint: dict[str, Any],
    run_config: dict[str, Any],
) -> str:  # fmt: skip
    lines = [ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()]
    detail = (lines[0] if lines else str(err))[:300].rstrip(".")
    section = checkpoint.get(CHECKPOINT_KEY) or {}
    stored = section.get("config") if isinstance(section, dict) else None
    changes = config_changes(stored, run_config) if isinstance(stored, dict) else []
    if changes:
        more = f" and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
        shown = ", ".join(changes[:SHOWN]) + more
        that = "that override" if len(changes) == 1 else "those overrides"
        advice = f"this command changes {shown}: drop {that} to continue the run"
    else:
        advice = "resume with the config the checkpoint was trained with (stored in it)"
    return f"{setting}: {path}: {what} ({detail}); {advice}"


def config_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key=value (the checkpoint's run: old)`` for each setting of :data:`SHAPING` that differs between a
    checkpoint's stored config and this run's (the stored one read with today's keys)."""
    old = _flat({k: v for k, v in _today(stored).items() if k in SHAPING})
    new = _flat({k: v for k, v in current.items() if k in SHAPING})
    return [
        f"{key}={_shown(new.get(key))} (the checkpoint's run: {_shown(old.get(key))})"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and key not in CACHES
    ]


def _today(config: dict[str, Any]) -> dict[str, Any]:
    return upgrade_stored_config(config)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
