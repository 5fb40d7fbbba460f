"""The run folder under faults: apps that write into a training run, two apps at once, a folder that is not
what it should be, a closed SSH session, a kill -9, a run folder deleted mid-run.

Real processes (``runs.fork_app``) on a copy of the shared short training made to look like a finished
command-line run (its ``.hydra/overrides.yaml``, the folder ``resume=auto`` finds):

- eval and render into a training run's folder are refused (one line, status 2) and leave it
  byte-identical; ``resume=auto`` still finds the run afterwards; the suggested subfolder works, twice;
- two evals started together into one folder: the second is refused by the folder's lock;
- ``checkpoints/last.ckpt`` that is a folder is refused before a step is trained;
- ``resume=auto`` continues the folder with a checkpoint, not a newer one without;
- SIGHUP stops training as SIGTERM does: ``last.ckpt`` at that step, one line, status 129, lock cleared;
- the hidden ``.views.tmp-*`` / ``.frames.tmp-*`` of an eval / render killed with SIGKILL are removed by the
  next one into the folder;
- a run folder deleted during training: one line naming it, status 2, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from runs import TINY, TINY_TRAIN, TRAINED_STEPS, fork_app

from nerf_lightning.errors import EXIT_HANGUP, EXIT_USER_ERROR
from nerf_lightning.run.checkpoint_io import read_checkpoint
from nerf_lightning.run.hangup import hang_up_as_sigterm
from nerf_lightning.run.resume import find_matching_run

pytestmark = pytest.mark.slow

#: a tiny video, fast on the CPU
RENDER = ["frames=2", "width=8", "height=8"]


def _command(scene: Path) -> list[str]:
    """The shared training's command line (what its ``.hydra/overrides.yaml`` records)."""
    return ["experiment=null", f"data.path={scene}", f"trainer.max_steps={TRAINED_STEPS}", *TINY]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(trained_run, tiny_scene: Path, tmp_path: Path) -> Path:
    """A copy of the shared training where ``train resume=auto`` launched in ``tmp_path`` looks for it."""
    run = tmp_path / "outputs" / "runs" / "train" / "2026-12-01_08-00-00"
    shutil.copytree(trained_run[0], run, ignore=shutil.ignore_patterns(".hydra", "*.log", ".lock"))
    (run / ".hydra").mkdir()
    # what Hydra records: the command line as the train app passes it on (`experiment=null` taken out)
    recorded = [a for a in _command(tiny_scene) if a != "experiment=null"]
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {a}\n" for a in recorded))
    return run


def _start(tmp_path: Path, name: str, app: str, *argv: str):
    return fork_app(app, *argv, cwd=tmp_path, log=tmp_path / f"{name}.log", err_log=tmp_path / f"{name}.err")


def _run(tmp_path: Path, name: str, app: str, *argv: str) -> tuple[int | None, str]:
    """Run an app to its end; (exit status, its stderr)."""
    proc = _start(tmp_path, name, app, *argv)
    proc.join(timeout=300)
    if proc.is_alive():
        proc.kill()
    err = tmp_path / f"{name}.err"
    return proc.exitcode, err.read_text() if err.exists() else ""


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _wait_for(condition, proc, timeout_s: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.is_alive(), "the process ended before the moment the test waits for"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ------------------------------------------------------------------- a training run's folder (1, 2)
@pytest.mark.parametrize(
    "app, args", [("eval", []), ("render", RENDER), ("render", [*RENDER, "save_frames=true"])]
)
def test_eval_and_render_never_write_into_a_training_run(
    app: str, args: list[str], finished_run: Path, tiny_scene: Path, tmp_path: Path
) -> None:
    before = _files(finished_run)
    code, stderr = _run(tmp_path, app, app, f"ckpt={finished_run}", *args, f"hydra.run.dir={finished_run}")

    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr) == (
        f"error: {finished_run}: holds a training run (checkpoints/last.ckpt, metrics.json); {app} writes "
        "only into a folder of its own, never over a run's record (.hydra/, metrics.json): choose a fresh "
        f"hydra.run.dir, e.g. hydra.run.dir={finished_run / app}"
    )
    assert _files(finished_run) == before  # metrics.json (its 25 keys), .hydra/, no .lock, no views

    # the run is still the one `resume=auto` continues: finished, nothing trained
    code, stderr = _run(tmp_path, "resume", "train", *_command(tiny_scene), "resume=auto")
    assert code == 0, stderr[-3000:]
    assert f"resume=auto: continuing {finished_run.resolve()} from " in stderr
    assert f"{finished_run}: this run already finished at step {TRAINED_STEPS}" in stderr
    assert sorted(p.name for p in finished_run.parent.iterdir()) == [finished_run.name]  # no new run


def test_the_suggested_subfolder_takes_an_eval_and_another_one(finished_run: Path, tmp_path: Path) -> None:
    before = _files(finished_run)
    sub = finished_run / "eval"
    for name in ("first", "second"):  # an eval's own folder is written again, as before
        code, stderr = _run(tmp_path, name, "eval", f"ckpt={finished_run}", f"hydra.run.dir={sub}")
        assert code == 0, stderr[-3000:]
    doc = json.loads((sub / "metrics.json").read_text())
    assert doc["split"] == "val" and doc["step"] == TRAINED_STEPS and doc["n_views"] == len(doc["views"])
    assert (sub / ".hydra" / "overrides.yaml").read_text() == f"- ckpt={finished_run}\n"
    assert (sub / ".lock").read_bytes() == b""  # taken and given back
    assert {k: v for k, v in _files(finished_run).items() if not k.startswith("eval/")} == before


# -------------------------------------------------------------------------- two evals at once (3)
def test_two_evals_into_one_folder_the_second_is_refused(finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    slow = "trainer.callbacks=[{_target_:faults.SlowValidation,seconds:1.0}]"
    first = _start(tmp_path, "first", "eval", f"ckpt={finished_run}", slow, f"hydra.run.dir={out}")
    # the first one has passed its checks and scores its views (a second at least each)
    _wait_for(lambda: (out / ".hydra" / "overrides.yaml").is_file(), first)
    pid = first.pid

    code, stderr = _run(
        tmp_path, "second", "eval", f"ckpt={finished_run}", "split=train", f"hydra.run.dir={out}"
    )
    assert code == EXIT_USER_ERROR, stderr[-3000:]
    line = _error_line(stderr)
    assert line.startswith(f"error: {out.resolve()}: another run is writing into this folder (pid {pid} on ")
    first.join(timeout=300)
    assert first.exitcode == 0, (tmp_path / "first.err").read_text()[-3000:]
    assert json.loads((out / "metrics.json").read_text())["split"] == "val"  # the first one's (no test split)
    assert "split=train" not in (out / ".hydra" / "overrides.yaml").read_text()
    assert (out / ".lock").read_bytes() == b""


# ----------------------------------------------------------------------- last.ckpt a folder (8)
def test_a_last_ckpt_that_is_a_folder_is_refused_before_training(tiny_scene: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "last.ckpt").mkdir(parents=True)
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "trainer.max_steps=5", f"hydra.run.dir={run}"]
    code, stderr = _run(tmp_path, "train", "train", *args, "ckpt_path=last")

    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr) == (
        f"error: {run / 'checkpoints' / 'last.ckpt'}: is a folder, not a checkpoint file; this run writes "
        "its checkpoint there: move it away, or choose another hydra.run.dir"
    )
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == ["checkpoints", "checkpoints/last.ckpt"]


# -------------------------------------------------------------- resume=auto: the folder with a ckpt (9)
def test_resume_auto_prefers_the_folder_with_a_checkpoint(tmp_path: Path) -> None:
    def make(name: str, age_s: float, checkpoint: bool) -> Path:
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text("- trainer.max_steps=400\n")
        if checkpoint:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
        stamp = time.time() - age_s
        os.utime(folder / ".hydra" / "overrides.yaml", (stamp, stamp))
        return folder

    older = make("2026-12-01_08-00-00", age_s=600, checkpoint=True)
    make("2026-12-01_09-00-00", age_s=60, checkpoint=False)  # died before its first checkpoint
    assert find_matching_run(tmp_path, ["trainer.max_steps=400", "resume=auto"]) == older
    newer = make("2026-12-01_10-00-00", age_s=10, checkpoint=True)
    assert find_matching_run(tmp_path, ["trainer.max_steps=400"]) == newer


# ---------------------------------------------------------------------------------- SIGHUP (10)
def test_sighup_stops_training_as_sigterm_does(tiny_scene: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    hup = [
        "+callbacks.fault._target_=faults.SignalAt",
        "+callbacks.fault.step=3",
        "+callbacks.fault.signum=1",
    ]
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "trainer.max_steps=20", *hup, f"hydra.run.dir={run}"]
    code, stderr = _run(tmp_path, "train", "train", *args)

    assert code == EXIT_HANGUP == 129, stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    assert _error_line(stderr) == (
        f"error: training stopped by SIGHUP at step 4 of 20; {last} holds step 4: the same command plus "
        "ckpt_path=last (or resume=auto) continues it"
    )
    assert read_checkpoint(last)["global_step"] == 4
    assert (run / ".lock").read_bytes() == b""  # no pid left behind
    assert not (run / "metrics.json").exists()


def test_an_ignored_sighup_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    try:
        hang_up_as_sigterm()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


# ------------------------------------------------------------------------ kill -9 leftovers (11)
def test_the_views_of_an_eval_killed_with_sigkill_are_removed_by_the_next(
    finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    slow = "trainer.callbacks=[{_target_:faults.SlowValidation,seconds:3.0}]"
    victim = _start(tmp_path, "victim", "eval", f"ckpt={finished_run}", slow, f"hydra.run.dir={out}")
    _wait_for(lambda: any(out.glob(".views.tmp-*/*.png")), victim)
    victim.kill()
    victim.join(timeout=30)
    (left,) = out.glob(".views.tmp-*")

    code, stderr = _run(tmp_path, "next", "eval", f"ckpt={finished_run}", f"hydra.run.dir={out}")
    assert code == 0, stderr[-3000:]
    assert not left.exists() and sorted(p.name for p in out.glob(".views.*")) == []
    assert (
        len(list((out / "views").glob("*_depth.png")))
        == json.loads((out / "metrics.json").read_text())["n_views"]
    )


def test_the_frames_of_a_render_killed_with_sigkill_are_removed_by_the_next(
    finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "render"
    many = ["frames=2000", "width=8", "height=8", "save_frames=true", "depth=false"]
    victim = _start(tmp_path, "victim", "render", f"ckpt={finished_run}", *many, f"hydra.run.dir={out}")
    _wait_for(lambda: any(out.glob(".frames.tmp-*/rgb_0001.png")), victim)
    victim.kill()
    victim.join(timeout=30)
    (left,) = out.glob(".frames.tmp-*")

    code, stderr = _run(tmp_path, "next", "render", f"ckpt={finished_run}", *RENDER, "save_frames=true",
                        f"hydra.run.dir={out}")  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert not left.exists() and sorted(p.name for p in out.glob(".frames.*")) == []
    assert sorted(p.name for p in (out / "frames").iterdir()) == ["rgb_0000.png", "rgb_0001.png"]


# ------------------------------------------------------------------- run folder deleted (from 6)
def test_a_run_folder_deleted_during_training_is_one_line(tiny_scene: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    rm = ["+callbacks.fault._target_=faults.RemoveFolderAt", f"+callbacks.fault.folder={run}",
          "+callbacks.fault.step=2"]  # fmt: skip
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "trainer.max_steps=5", *rm, f"hydra.run.dir={run}"]
    code, stderr = _run(tmp_path, "train", "train", *args)

    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr) == (
        f"error: {run}: the run folder was deleted while train was writing into it ({run}/csv/metrics.csv: "
        "no such file or directory); what the run had written there is gone: run the command again"
    )
