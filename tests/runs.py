"""Running the real entry points in subprocesses, on a tiny scene (shared by the resume/app/error tests)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

#: a short CPU training on a small rendering of the default scene (its objects, at 40x40 pixels)
TINY = [
    "data.batch_size=512",
    "model.net.step.sample_budget=null",  # fixed rays per step
    "data.steps_per_epoch=60",
    "model.net.renderer.occupancy.resolution=32",
    "model.net.renderer.occupancy.warmup_steps=16",
    "model.net.field.encoding.n_levels=8",
    "model.net.field.encoding.log2_hashmap_size=14",
    "model.net.field.encoding.max_resolution=256",
    "model.net.renderer.step_size=0.0135",
    "model.net.renderer.max_samples_per_ray=128",
    "trainer.check_val_every_n_epoch=1000",
    "trainer.log_every_n_steps=10",
    "callbacks.progress_bar=null",
    "accelerator=cpu",
    "logger=csv",
    # the opacity loss (off by default) on these renders: the mesh export of the 120-step run needs it
    # (texture 25.2 dB against 24.9 without it, and the objects' full extent)
    "model.net.loss.alpha_weight=auto",
]
TRAINED_STEPS = 120

#: the CPU preset shrunk to a few seconds of training (same pipeline: hash grid, occupancy grid, ...)
TINY_TRAIN = [
    "experiment=cpu",
    "accelerator=cpu",
    "logger=csv",
    "data.batch_size=512",
    "data.steps_per_epoch=20",
    "model.net.renderer.occupancy.resolution=32",
    "model.net.renderer.occupancy.warmup_steps=16",
    "model.net.field.encoding.n_levels=4",
    "model.net.field.encoding.log2_hashmap_size=12",
    "model.net.field.encoding.max_resolution=64",
    "model.net.renderer.step_size=0.0135",
    "model.net.renderer.max_samples_per_ray=64",
    "callbacks.progress_bar=null",
    "trainer.enable_model_summary=false",
]


def child_env(**extra: str) -> dict[str, str]:
    """This checkout's sources first; one intra-op thread (deterministic floats, no oversubscription)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_MODE")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        WANDB_MODE="disabled",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _fork_main(
    app: str, argv: list[str], cwd: str, log: str, err_log: str | None, env: dict[str, str], path: list[str]
) -> None:
    import gc

    # the test process's objects stay where they are: no collection walks them (and copies their pages)
    gc.freeze()
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = out if err_log is None else os.open(err_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(err, 2)
    # not the test runner's capture objects
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = path
    import faulthandler
    import importlib
    import signal
    import traceback

    import torch
    from hydra.core.global_hydra import GlobalHydra

    # The signal dispositions of a fresh interpreter, not the test process's: a test process was seen with
    # SIGINT ignored (Lightning ignores it while it destroys a process group and after a KeyboardInterrupt
    # in a fit), and a view process forked from it served on after the Ctrl-C that stops it
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGUSR1 prints every thread's stack into the log: what a child that does not stop was doing
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    torch.set_num_threads(1)
    GlobalHydra.instance().clear()
    sys.argv = [f"nerf_lightning.{app}", *argv]
    code = 0
    try:
        importlib.import_module(f"nerf_lightning.apps.{app}").main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the log
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fork_app(
    app: str,
    *argv: str,
    cwd: Path,
    log: Path,
    err_log: Path | None = None,
    env: dict[str, str] | None = None,
    path: list[str] | None = None,
):
    """``python -m nerf_lightning.<app> argv...`` in a child forked from the test process: a real process
    (its own PID, killable, its own exit status), without the seconds of interpreter and import
    start-up. Its stdout goes to ``log`` (appended), its stderr too unless ``err_log`` is given. It runs
    in the environment ``env`` (default: ``child_env()``), with ``path`` in front of ``sys.path``."""
    import multiprocessing as mp

    args = (app, list(argv), str(cwd), str(log), None if err_log is None else str(err_log),
            child_env() if env is None else env, list(path or []))  # fmt: skip
    import torch

    # A CUDA context does not survive fork(): once this process has one (GPU tests), spawn instead.
    method = "spawn" if torch.cuda.is_initialized() else "fork"
    proc = mp.get_context(method).Process(target=_fork_main, args=args)
    proc.start()
    return proc


def run_ranks(fn, args: tuple, nprocs: int = 2, timeout_s: float = 180.0) -> None:  # noqa: ANN001
    """``fn(rank, *args)`` in ``nprocs`` forked processes (they inherit the imported torch); raises what a
    rank raised, and fails the test, killing the ranks, if they are not all done within ``timeout_s``.
    A rank that hangs (a gloo peer gone while a collective or its process group's threads wait for it)
    would otherwise hold the test, and the suite, until gloo's own 30-minute timeout."""
    import time

    import pytest
    import torch.multiprocessing as mp

    ranks = mp.start_processes(fn, args=args, nprocs=nprocs, start_method="fork", join=False)
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            pytest.fail(f"the {nprocs} ranks of {fn.__name__} did not finish within {timeout_s:.0f} s")


def user_error_line(capsys, fn) -> str:  # noqa: ANN001 - pytest's CaptureFixture, a callable
    """Run ``fn`` under the apps' ``user_errors``: it must exit with EXIT_USER_ERROR after printing exactly
    one ``error: ...`` line to stderr, which is returned."""
    import pytest

    from nerf_lightning.errors import EXIT_USER_ERROR, user_errors

    with pytest.raises(SystemExit) as exit_info:
        with user_errors():
            fn()
    assert exit_info.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]
