"""The shared entry of the Hydra apps: a task function ``task(cfg)`` becomes a command line ``main()``.

    main = hydra_app("export", export, positional="what")

``main()`` rewrites ``sys.argv`` (:func:`normalize_argv`, then the app's own ``prepare_argv``), composes
``conf/<config_name>.yaml`` with it (``@hydra.main``) and runs the task inside
:func:`~nerf_lightning.errors.user_errors`: bad input ends as one ``error: ...`` line and exit status 2
(a diverged training 3, SIGTERM 143, SIGHUP 129, Ctrl-C 130; ``errors.py`` lists them). A SIGHUP (the
SSH session closed) is handled as a SIGTERM (``run/hangup.py``).
The task's return value is the job's return value (what a Hydra sweeper optimizes).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.errors import (
    EXIT_DIVERGED,
    EXIT_USER_ERROR,
    Cancelled,
    UserError,
    user_errors,
    written_file,
)
from nerf_lightning.run.config import CONF_DIR, alias_override
from nerf_lightning.run.folder_guard import end_job
from nerf_lightning.run.hangup import hang_up_as_sigterm, interruption, stop_signal
from nerf_lightning.run.run_dir import register_resolvers

__all__ = ["check_overrides_parse", "device_of", "hydra_app", "nested_overrides", "normalize_argv"]

#: Config nodes of the apps that work on a checkpoint (eval, render, export) that hold overrides of the
#: *checkpoint's* config: empty in the app's own config, so an override must be allowed to add keys.
CHECKPOINT_NODES = ("data", "model")

_NUMERIC_GROUP_CHOICE = re.compile(r"^(\+{0,2}precision)=(\d+)$")


def normalize_argv(
    argv: Sequence[str], positional: str | None = None, open_nodes: Sequence[str] = ()
) -> list[str]:
    """The command line as Hydra should read it.

    - a leading bare word -> ``<positional>=word`` (``python -m nerf_lightning.export mesh ...``);
    - an old key (``Formerly`` on its parameter: ``run/config_tree.key_aliases``) -> the config's key
      (``model.encoding.x`` -> ``model.net.field.encoding.x``, ``model.renderer.near_plane`` ->
      ``model.net.renderer.near_plane``);
    - ``precision=32`` -> ``precision='32'`` (a choice of the ``precision`` group; Hydra would parse an int);
    - ``<node>.k=v`` for a node of ``open_nodes`` -> ``++<node>.k=v`` (adds the key when it is new).
    """
    opened = tuple(f"{node}." for node in open_nodes)
    out = []
    for i, arg in enumerate(argv):
        if positional and i == 0 and "=" not in arg and not arg.startswith("-"):
            arg = f"{positional}={arg}"
        arg = _NUMERIC_GROUP_CHOICE.sub(r"\1='\2'", alias_override(arg))
        out.append(f"++{arg}" if opened and arg.startswith(opened) else arg)
    return out


def check_overrides_parse(argv: Sequence[str]) -> None:
    """Refuse a command-line override that Hydra's grammar cannot read, in one line that names its key and
    how to quote the value (Hydra would print its parser's message without the key, and exit 1).

    Raises:
        UserError: ``data.path: the override 'data.path=/x/a=b' does not parse (...); ...``.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:  # Hydra's flags and their values
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as err:
            key, value = arg.split("=", 1)
            reason = str(err).splitlines()[0]
            raise UserError(
                f"{key.lstrip('+~')}: the override {arg!r} does not parse ({reason}); quote the value "
                f"(Hydra's override grammar reads '=', brackets and commas in it), e.g. '{key}=\"{value}\"'"
            ) from None


def hydra_app(
    config_name: str,
    task: Callable[[DictConfig], Any],
    positional: str | None = None,
    open_nodes: Sequence[str] = CHECKPOINT_NODES,
    prepare_argv: Callable[[list[str]], list[str]] | None = None,
    stop_on_sigterm: bool = False,
) -> Callable[[], None]:
    """The ``main()`` of an app that runs ``task`` on ``conf/<config_name>.yaml``.

    Args:
        config_name: the app's root config.
        task: ``task(cfg)``; runs with float32 matmuls at ``high`` precision (TF32 on GPUs that have it).
        positional: the config key that a leading bare word sets (``what`` of ``export mesh``).
        open_nodes: config nodes whose keys an override may add (default: the checkpoint apps' ``data``
            and ``model`` overrides; ``()`` for an app whose config defines every key).
        prepare_argv: the app's own rewrite of the normalized command line (train: device preset, resume).
        stop_on_sigterm: SIGTERM raises :class:`~nerf_lightning.errors.Interrupted` in the task (its
            ``finally`` / ``except`` clauses remove partial outputs; exit status 143), and Ctrl-C ends
            it the same way with :class:`~nerf_lightning.errors.Cancelled` (exit status 130) instead of
            a traceback. Not for apps that run a Lightning Trainer: Lightning handles both itself.
    """
    register_resolvers()  # before Hydra resolves the run directory (conf/hydra/default.yaml)

    # An absolute config path: Hydra would otherwise look for a `nerf_lightning.conf` Python package
    # whenever the app's module is not `__main__` (console scripts, `python -m nerf_lightning.render`).
    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    @functools.wraps(task)  # Hydra names the job after the task's module (hydra.job.name)
    def run(cfg: DictConfig) -> Any:
        torch.set_float32_matmul_precision("high")
        try:
            return _run_task(cfg)
        finally:
            # however the job ended: its folder keeps its record, or one it never wrote into (a refused
            # command) is left as it was, lock file included (run/folder_guard.py)
            end_job()

    def _run_task(cfg: DictConfig) -> Any:
        try:
            with user_errors():
                if stop_on_sigterm:
                    signal.signal(signal.SIGTERM, _raise_interrupted(config_name))
                hang_up_as_sigterm()
                folder = _folder_identity(cfg)
                try:
                    return task(cfg)
                except FileNotFoundError as err:
                    gone = _folder_gone(cfg, folder, config_name, err)
                    if gone is None:
                        raise
                    raise gone from err
                except KeyboardInterrupt:
                    if not stop_on_sigterm:
                        raise
                    # the task's clean-up ran on the way out (as for SIGTERM): one line, status 130
                    raise Cancelled(
                        f"{config_name} stopped by Ctrl-C before it finished; no partial output is left"
                    ) from None
        except SystemExit as stop:
            # In a sweep, one job's bad value or divergence (a learning rate too high, say) is that job's
            # result, not the sweep's end: its line is printed, the sweeper gets NaN (Optuna records a
            # failed trial) and the sweep exits with the status once every job has run.
            if stop.code in SWEEP_JOB_FAILURES and _in_multirun():
                failed.append(int(stop.code))
                return float("nan")
            raise

    failed: list[int] = []

    def main() -> None:
        with user_errors():  # a removed key is one line, before Hydra makes a run folder
            check_overrides_parse(sys.argv[1:])
            argv = normalize_argv(sys.argv[1:], positional, open_nodes)
            if prepare_argv is not None:
                argv = prepare_argv(argv)
        sys.argv = [sys.argv[0], *argv]
        failed.clear()
        run()
        if failed:
            print(f"error: {len(failed)} job(s) of the sweep failed (their lines are above); the others ran",
                  file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(max(failed))

    main.__doc__ = f"``{config_name}``: run ``{task.__name__}`` on the command line's config."
    return main


#: exit statuses that end one job of a sweep but not the sweep: bad input of that job, divergence
SWEEP_JOB_FAILURES = (EXIT_USER_ERROR, EXIT_DIVERGED)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _folder_identity(cfg: DictConfig) -> tuple[int, int] | None:
    """(device, inode) of the app's run folder as its task starts (None when there is none yet)."""
    folder = OmegaConf.select(cfg, "paths.output_dir", default=None)
    try:
        info = os.stat(str(folder))
    except (OSError, TypeError):
        return None
    return info.st_dev, info.st_ino


def _folder_gone(
    cfg: DictConfig, started: tuple[int, int] | None, app: str, err: FileNotFoundError
) -> UserError | None:
    """The line for ``err`` when the app's run folder was deleted while it ran (``rm -rf`` of the run; a
    checkpoint write may have made a new, empty one since), else None (a file missing for another reason
    stays a traceback)."""
    if started is None or _folder_identity(cfg) == started:
        return None
    missing = written_file(err) or "a file"
    return UserError(
        f"{cfg.paths.output_dir}: the run folder was deleted while {app} was writing into it ({missing}: no "
        "such file or directory); what the run had written there is gone: run the command again"
    )


def _raise_interrupted(app: str) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        raise interruption(f"{app} stopped by {stop_signal()} before it finished; no partial output is left")

    return handler


def nested_overrides(node: Any) -> dict[str, Any]:
    """A config node of overrides as a plain nested dict ({} when unset)."""
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def device_of(accelerator: str) -> torch.device:
    """``auto``/``gpu``/``cuda``: the first GPU when there is one, else the CPU; ``cpu``: the CPU."""
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")
