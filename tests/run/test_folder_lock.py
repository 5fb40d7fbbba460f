"""Two runs into one folder: the folder is claimed atomically, and a folder whose run died is told apart.

- Two ``train`` commands started at the same moment into one ``hydra.run.dir`` (the second with another
  seed): before the claim both exited 0 and the folder mixed the files of both runs. Now exactly one
  trains; the other ends with one line and exit status 2 before it writes anything.
- The claim is held by a live process only: once its holder is killed with SIGKILL, the folder is
  claimed again and the record of the dead run is reported.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from runs import TINY_TRAIN, fork_app

from nerf_lightning.errors import EXIT_USER_ERROR, UserError
from nerf_lightning.run.folder_lock import LOCK_NAME, abandon_folder, claim_folder, release_folder


def _hold(folder: str, ready) -> None:  # noqa: ANN001 - a multiprocessing Event
    claim_folder(Path(folder))
    ready.set()
    time.sleep(300)


def _holder(folder: Path) -> mp.Process:
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(folder), ready), daemon=True)
    proc.start()
    assert ready.wait(30), "the holder never claimed the folder"
    return proc


def test_a_held_folder_is_refused_and_a_dead_holder_is_recognised(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = _holder(folder)
    try:
        busy = rf"another run is writing into this folder \(pid {holder.pid} on "
        with pytest.raises(UserError, match=busy):
            claim_folder(folder)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
    lock = claim_folder(folder)  # the kernel released the dead process's lock
    try:
        assert lock is not None and lock.previous is not None and lock.previous["pid"] == holder.pid
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        release_folder(folder)
    assert (folder / LOCK_NAME).read_text() == ""  # a run that ended clears its record
    lock = claim_folder(folder)
    try:
        assert lock is not None and lock.previous is None  # nothing reported after a clean end
    finally:
        release_folder(folder)


def test_a_refused_claim_gives_the_lock_file_back_as_it_found_it(tmp_path: Path) -> None:
    """``abandon_folder``: the record of a run that died, byte for byte; no lock file where there was none."""
    died = tmp_path / "died"
    died.mkdir()
    record = b'{"pid": 999999,  "host": "node7", "started": "2026-12-01 08:00:00"}\n'  # not json.dumps'
    (died / LOCK_NAME).write_bytes(record)
    lock = claim_folder(died)
    assert lock is not None and lock.previous is not None and lock.previous["pid"] == 999999
    assert (died / LOCK_NAME).read_bytes() != record  # this process's record while it holds the folder
    abandon_folder(died)
    assert (died / LOCK_NAME).read_bytes() == record
    new = tmp_path / "new"
    claim_folder(new)
    abandon_folder(new)
    assert list(new.iterdir()) == []
    lock = claim_folder(new)  # free again: a later claim creates the file anew
    try:
        assert lock is not None and lock.previous is None
    finally:
        release_folder(new)


@pytest.mark.slow
def test_two_runs_started_together_into_one_folder(tiny_scene: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "trainer.max_steps=4", f"hydra.run.dir={run}"]
    procs = {
        seed: fork_app(
            "train",
            *args,
            f"seed={seed}",
            cwd=tmp_path,
            log=tmp_path / f"{seed}.log",
            err_log=tmp_path / f"{seed}.err",
        )  # fmt: skip
        for seed in (1, 7)
    }
    for proc in procs.values():
        proc.join(timeout=300)
    codes = {seed: proc.exitcode for seed, proc in procs.items()}
    errs = {seed: (tmp_path / f"{seed}.err").read_text() for seed in procs}
    assert sorted(codes.values()) == [0, EXIT_USER_ERROR], (codes, errs)
    winner = next(seed for seed, code in codes.items() if code == 0)
    loser = next(seed for seed, code in codes.items() if code == EXIT_USER_ERROR)
    lines = [ln for ln in errs[loser].splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in errs[loser], errs[loser]
    assert lines[0].startswith(f"error: {run}: another run is writing into this folder (pid "), lines[0]
    assert lines[0].endswith("; wait for it to end, or choose another hydra.run.dir")
    # the folder is the winner's alone: its config, its metrics, one log
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["seed"] == winner
    assert json.loads((run / "metrics.json").read_text())["steps"] == 4
    assert sorted(p.name for p in run.glob("*.log")) == ["train.log"]
    assert "another run is writing" not in (run / "train.log").read_text()
    assert (run / LOCK_NAME).read_text() == ""  # released by a run that finished
