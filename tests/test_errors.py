"""Errors a user can act on (one line, no traceback, exit status 2) and a DDP rank crash that ends the run."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import hydra
import pytest
import torch
import torch.multiprocessing as mp
from runs import TINY_TRAIN, child_env, fork_app, user_error_line

from nerf_lightning.apps.train import train
from nerf_lightning.errors import EXIT_USER_ERROR, user_errors
from nerf_lightning.run.config import compose_train_config


def test_user_errors_of_train_are_one_line(compose_cfg, tiny_scene: Path, capsys, monkeypatch) -> None:
    line = user_error_line(capsys, lambda: train(compose_cfg("data.path=/no/such/capture", "logger=none")))
    assert "/no/such/capture: capture path does not exist" in line

    cfg = compose_cfg(f"data.path={tiny_scene}", "model.net.loss.kind=l1", "logger=none", "accelerator=cpu")
    line = user_error_line(capsys, lambda: train(cfg))
    assert line == "error: model.net.loss.kind=l1: expected one of huber, mse"

    monkeypatch.delenv("NERF_LIGHTNING_FOX", raising=False)
    line = user_error_line(capsys, lambda: train(compose_cfg("experiment=fox", "logger=none")))
    assert "`data.path`" in line and "NERF_LIGHTNING_FOX" in line

    cfg = compose_cfg(f"data.path={tiny_scene}", "ckpt_path=/no/run/last.ckpt", "logger=none")
    line = user_error_line(capsys, lambda: train(cfg))
    assert "ckpt_path=/no/run/last.ckpt: no such checkpoint" in line


def test_the_opacity_loss_on_photographs_is_a_user_error(compose_cfg, tmp_path: Path, capsys) -> None:
    """``model.net.loss.alpha_weight`` needs images with alpha: on opaque photographs the run stops before
    training."""
    from nerf_lightning.data.synthetic import generate_scene

    photos = generate_scene(tmp_path / "phone", n_views=9, width=24, height=20, supersample=1, rig="phone")
    overrides = (
        f"data.path={photos.parent}",
        "model.net.loss.alpha_weight=0.5",
        "logger=none",
        "accelerator=cpu",
    )
    cfg = compose_cfg(*overrides)
    line = user_error_line(capsys, lambda: train(cfg))
    assert (
        f"model.net.loss.alpha_weight=0.5: the training images of {photos.parent} carry no alpha channel"
        in line
    )
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()


def test_the_removed_training_background_is_one_line(compose_cfg, capsys) -> None:
    """``data.train_background`` (the evaluation background lost to random colours on lego's published
    protocol) is one line naming why; a checkpoint's stored config that holds it loads without it."""
    from nerf_lightning.run.config import drop_removed_keys

    line = user_error_line(capsys, lambda: compose_cfg("data.train_background=eval", "logger=none"))
    assert line.startswith("error: data.train_background: no longer exists: every training ray is over a ")
    assert "docs/benchmarks/2026-12-07.md" in line
    stored = {"data": {"train_background": "eval", "downscale": 2}, "model": {"alpha_weight": "auto"}}
    assert drop_removed_keys(stored) == {"data": {"downscale": 2}, "model": {"alpha_weight": "auto"}}


def test_bugs_keep_their_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        with user_errors():
            _ = 1 / 0


def test_a_failed_copy_names_the_file_written_and_the_key_of_the_app(capsys) -> None:
    """shutil names the source of a copy first: the file that found the disk full is the second."""
    import errno

    from nerf_lightning.errors import writing_to

    full = OSError(errno.ENOSPC, "No space left on device", "/photos/a.jpg", None, "/capture/images/a.jpg")

    def export_onto_a_full_disk() -> None:
        with writing_to("out"):
            raise full

    assert user_error_line(capsys, export_onto_a_full_disk) == (
        "error: /capture/images/a.jpg: no space left on device; free space there or write elsewhere (out=...)"
    )
    read_only = OSError(errno.EROFS, "Read-only file system", "/ro/run/metrics.json")
    assert user_error_line(capsys, lambda: (_ for _ in ()).throw(read_only)) == (
        "error: /ro/run/metrics.json: read-only file system; choose a folder you can write "
        "(hydra.run.dir=...)"
    )


def _refused_line(tmp_path: Path, app: str, *argv: str) -> str:
    """Run ``python -m nerf_lightning.<app> argv...`` (forked: no interpreter start-up) and return the last
    line of its stderr, after checking it exited with the bad-input status and printed no traceback."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = fork_app(app, *argv, cwd=tmp_path, log=out, err_log=err)
    proc.join(timeout=120)
    stderr = err.read_text()
    assert proc.exitcode == EXIT_USER_ERROR, stderr[-3000:]
    assert "Traceback" not in stderr
    return stderr.strip().splitlines()[-1]


def test_entry_point_prints_one_line_to_stderr_and_the_log(tmp_path: Path) -> None:
    line = _refused_line(tmp_path, "eval", "ckpt=/no/such.ckpt", f"hydra.run.dir={tmp_path / 'a'}")
    assert line == "error: ckpt=/no/such.ckpt: no such file; expected a .ckpt file or a training run folder"
    assert "no such file" in (tmp_path / "a" / "eval.log").read_text()  # and in the job's log


def test_a_removed_key_on_the_command_line_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """The command line's keys are read before Hydra starts: a removed key is refused there, by the same
    one line and status as a bad value, and no run folder is made."""
    run = tmp_path / "run"
    line = _refused_line(tmp_path, "train", "data.train_background=white", f"hydra.run.dir={run}")
    assert line.startswith("error: data.train_background: no longer exists: ")
    assert not run.exists()


def test_an_override_hydra_cannot_parse_names_its_key_and_how_to_quote(tmp_path: Path) -> None:
    """A ``=`` in a value is a Hydra grammar error: one line naming the key, before Hydra starts."""
    run = tmp_path / "run"
    line = _refused_line(tmp_path, "train", "data.path=/captures/a=b", f"hydra.run.dir={run}")
    assert line == (
        "error: data.path: the override 'data.path=/captures/a=b' does not parse (mismatched input '=' "
        "expecting <EOF>); quote the value (Hydra's override grammar reads '=', brackets and commas in it), "
        """e.g. 'data.path="/captures/a=b"'"""
    )
    assert not run.exists()


def test_a_data_path_that_is_a_loop_of_links_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    line = _refused_line(tmp_path, "train", f"data.path={tmp_path / 'a'}", "experiment=cpu",
                         f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert line == (
        f"error: data.path={tmp_path / 'a'}: a loop of symbolic links, which leads to no folder; expected a "
        "capture folder"
    )


def test_hydra_full_error_re_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from nerf_lightning.errors import UserError

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra then prints the whole traceback
    with pytest.raises(UserError, match="bad capture"):
        with user_errors():
            raise UserError("bad capture")


def test_dist_timeout_reaches_the_strategies(compose_cfg) -> None:
    for name in ("ddp", "fsdp"):
        cfg = compose_cfg(f"strategy={name}", "dist_timeout_s=42")
        strategy = hydra.utils.instantiate(cfg.trainer.strategy)
        assert strategy._timeout == timedelta(seconds=42)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: str, overrides: list[str], run_dir: str, log: str) -> None:
    """One DDP rank, forked from the test process (no interpreter start-up), launched as torchrun /
    SLURM launch ranks: the environment says which rank it is, Lightning starts no processes."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = os.fdopen(fd, "w", buffering=1)  # not the test runner's capture objects
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", NODE_RANK="0", LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    code = 0
    try:
        train(compose_train_config(overrides, run_dir))
    except BaseException:  # noqa: BLE001 - the test reads the log
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_ddp_rank_failure_ends_the_run(mode: str, tiny_scene: Path, tmp_path: Path) -> None:
    """Two gloo ranks; at step 2 rank 1 raises (its process dies: gloo sees the closed connection) or
    hangs (alive, silent: only the timeout can end the wait). Either way rank 0, blocked in a
    collective, fails and exits non-zero; when hung, after ``dist_timeout_s``, not torch's default of
    30 minutes."""
    timeout_s = 4
    overrides = [
        *TINY_TRAIN,
        f"data.path={tiny_scene}",
        "strategy=ddp",
        "devices=2",
        f"dist_timeout_s={timeout_s}",
        "trainer.max_steps=50",
        "+callbacks.fault._target_=faults.RankFault",
        "+callbacks.fault.rank=1",
        "+callbacks.fault.step=2",
        f"+callbacks.fault.mode={mode}",
    ]
    port = str(_free_port())
    ctx = mp.get_context("fork")
    logs = [str(tmp_path / f"rank{r}.log") for r in range(2)]
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, overrides, str(tmp_path / "run"), logs[r]))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        procs[0].join(timeout=240)
        assert procs[0].exitcode not in (0, None), "rank 0 did not fail"
        out0 = Path(logs[0]).read_text()
        if mode == "raise":
            procs[1].join(timeout=60)
            assert "injected fault on rank 1" in Path(logs[1]).read_text()
            assert procs[1].exitcode == 1
        else:
            assert "timed out" in out0.lower() or "timeout" in out0.lower(), out0[-2000:]
            assert procs[1].is_alive()  # still hung: the timeout, not its death, ended rank 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_every_stop_has_its_exit_status(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from nerf_lightning.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, Diverged, Interrupted

    for raised, code in (
        (Diverged("training diverged at step 3"), EXIT_DIVERGED),
        (Interrupted("stopped by SIGTERM"), EXIT_INTERRUPTED),
        (SIGTERMException(), EXIT_INTERRUPTED),  # Lightning's own: a SystemExit of status 0
    ):
        with pytest.raises(SystemExit) as exit_info, user_errors():
            raise raised
        assert exit_info.value.code == code
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(("error: training diverged", "error: stopped by SIGTERM")), line
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # a traceback instead of the line, still not status 0
    with pytest.raises(Interrupted), user_errors():
        raise SIGTERMException()


@pytest.mark.slow
def test_a_killed_rank_ends_the_survivor_with_one_line(tiny_scene: Path, tmp_path: Path) -> None:
    """``kill -9`` of DDP rank 1 at step 2 (the OOM killer, a lost node): rank 0, in a gloo collective,
    ends with one line naming the rank that died and a non-zero status, not gloo's traceback."""
    overrides = [*TINY_TRAIN, f"data.path={tiny_scene}", "strategy=ddp", "devices=2", "dist_timeout_s=30",
                 "trainer.max_steps=50", f"hydra.run.dir={tmp_path / 'run'}",
                 "+callbacks.fault._target_=faults.RankFault", "+callbacks.fault.rank=1",
                 "+callbacks.fault.step=2", "+callbacks.fault.mode=kill"]  # fmt: skip
    port = str(_free_port())
    ranks = []
    for r in range(2):
        env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", NODE_RANK="0",
                        LOCAL_RANK=str(r))  # fmt: skip
        log = tmp_path / f"rank{r}.log"
        ranks.append(fork_app("train", *overrides, cwd=tmp_path, log=log, err_log=tmp_path / f"rank{r}.err",
                              env=env))  # fmt: skip
    try:
        ranks[0].join(timeout=240)
        ranks[1].join(timeout=30)
    finally:
        for p in ranks:
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
    assert ranks[1].exitcode == -9  # the kill
    stderr = (tmp_path / "rank0.err").read_text()
    assert ranks[0].exitcode not in (0, None), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: DDP rank 1 of 2 is gone (its process died or its node was lost; "
                           "Connection closed by peer [127.0.0.1]:"), line  # fmt: skip
    assert "at step 2 of " in line and "this rank (0) stopped too" in line, line
    assert not (tmp_path / "run" / "metrics.json").exists()
