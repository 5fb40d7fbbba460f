"""Shared fixtures: Hydra config composition against the package's conf/."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (before torch is imported, here and in the children that
# inherit the environment). On this 2-core machine a spinning pool of two threads next to any other busy
# process (a second test process, another job) runs several times slower than one thread.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import fcntl
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from runs import TINY, TRAINED_STEPS

from nerf_lightning.run.config import CONF_DIR, compose_app_config, compose_train_config

__all__ = ["CONF_DIR", "compose_app_config", "compose_train_config"]
REPO_ROOT = Path(__file__).resolve().parents[1]
FOX_DIR = REPO_ROOT.parent / "shared" / "data" / "fox"


@pytest.fixture
def compose_cfg(tmp_path: Path):
    def _compose(*overrides: str) -> DictConfig:
        return compose_train_config(list(overrides), tmp_path)

    yield _compose
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # a composed multirun config would make later tests "in a sweep"




@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) between the processes of this test session."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this test session shares: under pytest-xdist the one all workers'
    temporary folders sit in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24-view 40x40 generated scene, made once per session at one path for every worker: the shared
    training's capture (``trained_run``) is then the very folder each test names, so a command that
    continues that run names its capture as the run did."""
    from nerf_lightning.data.synthetic import generate_scene

    shared = _session_folder(tmp_path_factory)
    out = shared / "tiny_scene" / "tiny"
    with _locked(shared / "tiny_scene.lock"):
        if not (shared / "tiny_scene.done").is_file():
            generate_scene(out, n_views=24, width=40, height=40, supersample=2)
            (shared / "tiny_scene.done").write_text("")
    return out


@pytest.fixture(scope="session")
def trained_run(tiny_scene: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """(run folder, final metrics) of one short training, shared by the e2e and the entry-point tests,
    which only read it. Trained once per session: under pytest-xdist the first worker that needs it trains
    it into the folder all workers' temporary folders sit in, the others wait for it and read it (its
    capture is the session's one ``tiny_scene``)."""
    import torch

    from nerf_lightning.apps.train import train

    shared = _session_folder(tmp_path_factory)
    run_dir, done = shared / "trained_run", shared / "trained_run.json"
    with _locked(shared / "trained_run.lock"):
        if done.is_file():
            return run_dir, json.loads(done.read_text())
        torch.set_num_threads(2)
        run_dir.mkdir()
        try:
            cfg = compose_train_config(
                [f"data.path={tiny_scene}", f"trainer.max_steps={TRAINED_STEPS}", *TINY], run_dir
            )
            metrics = train(cfg)
        finally:
            GlobalHydra.instance().clear()
        done.write_text(json.dumps(metrics))
    return run_dir, metrics


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), read from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


#: helpers that serve this process itself and end with it (parts of their command lines): Open MPI's
#: daemon of a singleton MPI_Init (Lightning probes mpi4py where it is installed; killing the daemon
#: aborts this process before pytest reports) and multiprocessing's resource tracker
SERVICES_OF_THIS_PROCESS = ("orted ", "multiprocessing.resource_tracker")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Kill what the tests left running. A non-daemonic multiprocessing child is joined when its parent
    exits: one still training (a test that failed before its cleanup) would hold this test process,
    and the suite, until it ends on its own. Under pytest-xdist each worker cleans up after its own
    tests; the controller's children are the workers."""
    if session.config.pluginmanager.getplugin("dsession") is not None:
        return
    leftovers = _descendants(os.getpid())
    for pid in leftovers:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(service in cmd for service in SERVICES_OF_THIS_PROCESS):
                continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        print(f"\n[conftest] killed a process the tests left running: {pid} {cmd[:200]}", file=sys.stderr)
