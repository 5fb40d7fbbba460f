"""No silent successes: an interrupted, diverged or refused run never exits 0, and loses nothing.

Real processes (forked from the test process, ``runs.fork_app``) where the exit status is the point:

- SIGTERM in the middle of training: exit status 143, a ``last.ckpt`` of the step it stopped at, no
  ``metrics.json``; the same command plus ``ckpt_path=last`` then ends bit-identical to an uninterrupted
  run;
- a learning rate that makes training diverge: exit status 3 and one line naming the step and the
  learning rate;
- the same command again into a folder that holds a run: exit status 2 before anything is written
  (not even Hydra's ``.hydra/``); ``overwrite=true`` replaces it; a multirun into a fixed sweep folder
  is refused the same way.

In the test process: a NaN that appears in the weights mid-run never reaches ``last.ckpt`` (the file
keeps the last finite step); a full or read-only disk ends a training or an export with one line naming
the file.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from faults import PoisonWeights
from runs import TINY_TRAIN, fork_app, user_error_line

from nerf_lightning.apps.train import train
from nerf_lightning.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_USER_ERROR, Diverged
from nerf_lightning.run.checkpoint_io import read_checkpoint
from nerf_lightning.run.divergence import DivergenceGuard
from nerf_lightning.run.folder_guard import refuse_overwrite

STEPS = 30


def _args(scene: Path, *extra: str) -> list[str]:
    return [
        *TINY_TRAIN,
        f"data.path={scene}",
        f"trainer.max_steps={STEPS}",
        "trainer.log_every_n_steps=5",
        *extra,
    ]


def _run(tmp_path: Path, name: str, *argv: str, app: str = "train") -> tuple[int | None, str]:
    """Run an app to its end; (exit status, its stderr)."""
    err = tmp_path / f"{name}.err"
    proc = fork_app(app, *argv, cwd=tmp_path, log=tmp_path / f"{name}.log", err_log=err)
    proc.join(timeout=300)
    if proc.is_alive():
        proc.kill()
    return proc.exitcode, err.read_text() if err.exists() else ""


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------------------ SIGTERM
@pytest.mark.slow
def test_sigterm_exits_143_with_a_fresh_last_ckpt_that_resumes_exactly(
    tiny_scene: Path, tmp_path: Path
) -> None:
    run, ref = tmp_path / "run", tmp_path / "reference"
    reference = fork_app(
        "train", *_args(tiny_scene), f"hydra.run.dir={ref}", cwd=tmp_path, log=tmp_path / "r.log"
    )
    fault = ["+callbacks.fault._target_=faults.SignalAt", "+callbacks.fault.step=21"]
    code, stderr = _run(tmp_path, "victim", *_args(tiny_scene, *fault), f"hydra.run.dir={run}")

    assert code == EXIT_INTERRUPTED, stderr[-3000:]
    line = _error_line(stderr)
    assert line.startswith(f"error: training stopped by SIGTERM at step 22 of {STEPS}; ")
    assert f"{run / 'checkpoints' / 'last.ckpt'} holds step 22" in line and "ckpt_path=last" in line
    assert not (run / "metrics.json").exists()  # nothing claims a finished run
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 22  # written at the stop

    code, stderr = _run(tmp_path, "resumed", *_args(tiny_scene), f"hydra.run.dir={run}", "ckpt_path=last")
    assert code == 0, stderr[-3000:]
    reference.join(timeout=300)
    assert reference.exitcode == 0, (tmp_path / "r.log").read_text()[-3000:]
    assert json.loads((run / "metrics.json").read_text())["steps"] == STEPS
    a = read_checkpoint(ref / "checkpoints" / "last.ckpt")["state_dict"]
    b = read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"]
    for key, value in a.items():
        assert torch.equal(value, b[key]), f"{key} differs from the uninterrupted run"


# ---------------------------------------------------------------------------------------- divergence
@pytest.mark.slow
def test_a_diverging_learning_rate_exits_3_naming_the_step(tiny_scene: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, stderr = _run(tmp_path, "lr", *_args(tiny_scene, "model.optimizer.lr=1e30"), f"hydra.run.dir={run}")
    assert code == EXIT_DIVERGED, stderr[-3000:]
    line = _error_line(stderr)
    assert line.startswith("error: training diverged: the loss was NaN at step "), line
    step = int(line.split(" at step ")[1].split(" ")[0])
    assert 1 <= step <= 5  # the first NaN loss
    # found at the first check (every log_every_n_steps=5 steps): the run stopped there, not at the end
    assert f" at step {step} (stopped at step 5 of {STEPS}); lower the learning rate" in line, line
    assert "model.optimizer.lr=1e+30 now), e.g. model.optimizer.lr=0.01" in line
    assert not (run / "metrics.json").exists()
    assert not (run / "checkpoints" / "last.ckpt").exists()  # no NaN checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("weights_only", [False, True])
def test_nan_weights_never_replace_a_good_last_ckpt(
    tiny_scene: Path, compose_cfg, weights_only: bool
) -> None:
    """Steps 26 on are NaN; the check every 50 steps comes after the last step (30), so the write of
    step 30's last.ckpt is where the NaN is found and refused: by the divergence guard's
    ``on_save_checkpoint``, and for a weights-only checkpoint (for which Lightning calls no callback's
    hook) by the checkpoint writer itself."""
    torch.set_num_threads(2)
    cfg = compose_cfg(
        *_args(
            tiny_scene, "callbacks.last_checkpoint.every_n_train_steps=10", "trainer.log_every_n_steps=50"
        ),
        f"+callbacks.last_checkpoint.save_weights_only={str(weights_only).lower()}",
        "logger=none",
    )
    with pytest.raises(Diverged) as err:
        train(cfg, extra_callbacks=[PoisonWeights(step=25)])  # NaN from step 26 on
    last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if weights_only:
        assert str(err.value).startswith("training diverged: NaN/inf in "), str(err.value)
        assert f" at step 30 ({last} was not written); lower the learning rate" in str(err.value)
    else:
        assert str(err.value).startswith(
            f"training diverged: the loss was NaN at step 26 (stopped at step 30 of {STEPS}; its checkpoint "
            "was not written)"
        )
    assert f"{last} holds step 20" in str(err.value)
    ckpt = read_checkpoint(last)
    assert ckpt["global_step"] == 20
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values() if t.is_floating_point())


def _fake_trainer(step: int = 0, every: int = 10) -> SimpleNamespace:
    opt = SimpleNamespace(param_groups=[{"lr": 1e-3, "initial_lr": 1e-2}])
    return SimpleNamespace(
        global_step=step,
        accumulate_grad_batches=1,
        log_every_n_steps=every,
        world_size=1,
        optimizers=[opt],
        max_steps=100,
    )


def test_divergence_guard_reads_the_losses_at_its_check_steps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    guard, trainer, module = DivergenceGuard(), _fake_trainer(), torch.nn.Linear(2, 2)
    reads: list[str] = []
    real_bool = torch.Tensor.__bool__
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: reads.append("bool") or real_bool(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append("item") or 0.0)
    for step in range(1, 10):  # step 7's loss is NaN: nothing is read (no host sync) before step 10
        trainer.global_step = step
        guard.on_train_batch_end(
            trainer, module, {"loss": torch.tensor(float("nan") if step == 7 else 0.5)}, None, 0
        )
    assert reads == []
    trainer.global_step = 10
    with pytest.raises(
        Diverged, match=r"the loss was NaN at step 7 \(stopped at step 10 of 100\); lower the learning rate"
    ):
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.5)}, None, 0)
    assert reads.count("bool") >= 1


def test_divergence_guard_checks_the_weights_before_a_checkpoint() -> None:
    from lightning.pytorch.trainer.states import TrainerFn

    guard, trainer, module = DivergenceGuard(), _fake_trainer(step=3), torch.nn.Linear(2, 2)
    trainer.state = SimpleNamespace(fn=TrainerFn.FITTING)
    guard.on_save_checkpoint(trainer, module, {})  # finite: written
    with torch.no_grad():
        module.bias[1] = float("inf")
    with pytest.raises(
        Diverged, match=r"NaN/inf in bias at step 3 \(the checkpoint of that step was not written\)"
    ):
        guard.on_save_checkpoint(trainer, module, {})


def test_divergence_guard_scans_the_weights_at_its_check_steps_when_the_loss_stays_finite() -> None:
    """A NaN field under the sample budget leaves no valid ray, so the step's loss is a finite 0: the
    periodic check must find the weights themselves."""
    guard, trainer, module = DivergenceGuard(), _fake_trainer(), torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.weight[0, 1] = float("nan")
    for step in range(1, 10):
        trainer.global_step = step
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.0)}, None, 0)
    trainer.global_step = 10
    with pytest.raises(Diverged, match=r"NaN/inf in weight at step 10; lower the learning rate"):
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.0)}, None, 0)


# ------------------------------------------------------------------------------- an existing run folder
def _fake_run(folder: Path) -> dict[Path, bytes]:
    files = {
        folder / "checkpoints" / "last.ckpt": b"trained for a week",
        folder / "checkpoints" / "step020000.ckpt": b"the best",
        folder / "metrics.json": b'{"val/psnr": 35.0}',
        folder / ".hydra" / "overrides.yaml": b"- trainer.max_steps=20000\n",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@pytest.mark.slow
def test_the_same_command_into_a_run_folder_is_refused_until_overwrite(
    tiny_scene: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    files = _fake_run(run)
    code, stderr = _run(tmp_path, "again", *_args(tiny_scene), f"hydra.run.dir={run}")
    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr) == (
        f"error: {run}: already holds a training run (checkpoints/last.ckpt, checkpoints/step020000.ckpt, "
        "metrics.json); continue it with ckpt_path=last (or resume=auto), replace it with overwrite=true, "
        "or choose another hydra.run.dir"
    )
    assert {p: p.read_bytes() for p in files} == files  # untouched, .hydra/ included
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "checkpoints", "metrics.json"]  # no log

    sweep = tmp_path / "sweep"  # a multirun into a fixed sweep folder whose job 0 holds a run
    files = _fake_run(sweep / "0")
    code, stderr = _run(tmp_path, "sweep", "-m", *_args(tiny_scene), f"hydra.sweep.dir={sweep}", "seed=1,2")
    assert code == EXIT_USER_ERROR and f"error: {sweep / '0'}: already holds a training run" in stderr
    assert {p: p.read_bytes() for p in files} == files

    again = [*_args(tiny_scene, "trainer.max_steps=5"), f"hydra.run.dir={run}", "overwrite=true"]
    code, stderr = _run(tmp_path, "overwrite", *again)
    assert code == 0, stderr[-3000:]
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 5
    assert not (run / "checkpoints" / "step020000.ckpt").exists()  # the old run's best is gone with it
    assert json.loads((run / "metrics.json").read_text())["steps"] == 5


def test_continuing_a_run_folder_is_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    _fake_run(run)
    base = {"ckpt_path": None, "resume": "never", "overwrite": False}
    for allowed in (
        {"ckpt_path": "last"},
        {"resume": "auto"},
        {"overwrite": True},
        {"ckpt_path": "/a/b.ckpt"},
    ):
        refuse_overwrite(run, OmegaConf.create({**base, **allowed}))
    refuse_overwrite(tmp_path / "new", OmegaConf.create(base))  # nothing there
    (run / "hpc_ckpt_1.ckpt").write_bytes(b"x")  # a requeued SLURM job: Lightning resumes its hpc_ckpt
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "nerf")
    refuse_overwrite(run, OmegaConf.create(base))
    monkeypatch.delenv("SLURM_NTASKS")  # not under SLURM: nothing resumes the hpc_ckpt by itself
    with pytest.raises(Exception, match="already holds a training run"):
        refuse_overwrite(run, OmegaConf.create(base))


# ------------------------------------------------------------------------------------ a disk that fails
def _failing_fsync(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Every atomic write fails in ``fsync``, as it does on a full disk (data waits in the page cache)."""
    import types

    from nerf_lightning.utils import io

    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(io, "os", types.SimpleNamespace(**{**vars(os), "fsync": fsync}))


def test_a_full_disk_during_training_names_the_checkpoint(
    tiny_scene: Path, compose_cfg, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    cfg = compose_cfg(*_args(tiny_scene, "trainer.max_steps=3"), "logger=none")
    _failing_fsync(monkeypatch, errno.ENOSPC)
    line = user_error_line(capsys, lambda: train(cfg))
    out = Path(cfg.paths.output_dir)
    assert line.startswith(f"error: {out / 'checkpoints' / 'last.ckpt'}: no space left on device; free space")
    assert not (out / "metrics.json").exists()
    assert list((out / "checkpoints").iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize(
    "code, advice",
    [
        ("EROFS", "read-only file system; choose a folder you can write (out=...)"),
        ("ENOSPC", "no space left on device; free space there or write elsewhere (out=...)"),
    ],
)
def test_a_failing_disk_during_an_export_names_the_file_and_out(
    trained_run, capsys, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: str, advice: str
) -> None:
    """The export writes where ``out=`` says (its run folder by default): that is the key to change."""
    import errno

    from nerf_lightning.apps.export import export
    from nerf_lightning.run.config import compose_app_config

    run_dir, _ = trained_run
    cfg = compose_app_config(
        "export", ["what=mesh", f"ckpt={run_dir}", "resolution=16", "threshold=1", "format=ply"], tmp_path
    )
    _failing_fsync(monkeypatch, getattr(errno, code))
    line = user_error_line(capsys, lambda: export(cfg))
    assert line == f"error: {tmp_path / 'mesh.ply'}: {advice}"
    assert list(tmp_path.glob("*.ply")) == [] and list(tmp_path.glob(".*")) == []


def test_a_run_folder_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, stderr = _run(tmp_path, "ro", "ckpt=/no/such.ckpt", f"hydra.run.dir={blocker / 'run'}", app="eval")
    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr) == (
        f"error: {blocker / 'run'}: cannot write the run folder (not a directory); "
        "choose another with hydra.run.dir=..."
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_run_folder_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, stderr = _run(tmp_path, "ro", "ckpt=/no/such.ckpt", f"hydra.run.dir={folder}", app="eval")
    finally:
        folder.chmod(0o755)
    assert code == EXIT_USER_ERROR, stderr[-3000:]
    assert _error_line(stderr).startswith(f"error: {folder}: cannot write the run folder (permission denied)")


def test_sigterm_numbers() -> None:
    assert EXIT_INTERRUPTED == 128 + signal.SIGTERM and EXIT_DIVERGED == 3 and EXIT_USER_ERROR == 2


@pytest.mark.cuda
def test_sigterm_and_divergence_under_the_cuda_graphed_step(tiny_scene: Path, compose_cfg) -> None:
    """The GPU path: budgeted step captured as CUDA graphs, default precision (bf16-mixed on Ampere+)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    from faults import SignalAt

    from nerf_lightning.errors import Interrupted

    gpu = [
        f"data.path={tiny_scene}", "accelerator=gpu", "logger=none", "callbacks.progress_bar=null",
        "model.net.step.sample_budget=4096", "model.net.step.march_budget=16384",
        "model.net.step.n_rays_init=256",
        "data.batch_size=2048", "model.net.renderer.occupancy.resolution=32", "trainer.max_steps=60",
        "trainer.log_every_n_steps=10", "trainer.check_val_every_n_epoch=1000",
        "trainer.enable_model_summary=false",
    ]  # fmt: skip
    cfg = compose_cfg(*gpu, "model.optimizer.lr=1e30")
    # the loss itself may stay finite (a NaN field leaves no valid ray: a loss of 0); the weight scan of
    # the first periodic check (log_every_n_steps=10) names the parameters then
    first_check = r"^training diverged: .* at step (\d|10)( \(stopped at step 10 of \d+\))?; lower the"
    with pytest.raises(Diverged, match=first_check):
        train(cfg)
    assert not (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").exists()

    cfg = compose_cfg(*gpu, "callbacks.last_checkpoint.every_n_train_steps=10")
    # the loss check names step 26 (the first step after the poison) unless the NaN field leaves no
    # valid ray (a finite loss of 0, as under the graphed step): then the weight scan of the step-30 check
    with pytest.raises(Diverged, match=r"at step (26|30)[; ]"):
        train(cfg, extra_callbacks=[PoisonWeights(step=25)])
    ckpt = read_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 20
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values() if t.is_floating_point())

    cfg = compose_cfg(*gpu)
    with pytest.raises(Interrupted, match="stopped by SIGTERM at step 22 of 60"):
        train(cfg, extra_callbacks=[SignalAt(step=21)])
    assert read_checkpoint(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")["global_step"] == 22
