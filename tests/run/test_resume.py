"""Resume after a crash: a real training process killed with SIGKILL, restarted with the same command.

- The restarted run (``resume=auto``, no run folder given) finds the killed run's folder, continues its
  ``last.ckpt`` and ends bit-identical to an uninterrupted run of the same command: same step count,
  weights, occupancy grid, optimizer, scheduler and sampler state (anything not restored would show).
- A process killed in the middle of a checkpoint write leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from runs import TINY_TRAIN, fork_app

from nerf_lightning.apps.train import train
from nerf_lightning.data.capture_identity import FINGERPRINT_KEY
from nerf_lightning.run.checkpoint_io import AtomicCheckpointIO, read_checkpoint
from nerf_lightning.run.resume import comparable, find_matching_run, resolve_ckpt_path
from nerf_lightning.utils.io import remove_stale_temporaries

# Checkpoints every 8 steps = one epoch of 8 steps = the occupancy-grid update interval: the killed
# run resumes from a checkpoint taken at an epoch boundary on a grid-update step, written before the
# module's end-of-step hooks ran (see run/checkpoint_callbacks.py); grid updates and weighted sampling
# go on after it (warm-up ends at step 16).
STEPS = 32
EVERY = 8


def _step_of(path: Path) -> int | None:
    try:
        return int(read_checkpoint(path)["global_step"])
    except Exception:  # noqa: BLE001 - not there yet
        return None


@pytest.mark.slow
def test_kill_9_then_same_command_resumes_exactly(tiny_scene: Path, tmp_path: Path) -> None:
    args = [
        *TINY_TRAIN,
        f"data.path={tiny_scene}",
        f"trainer.max_steps={STEPS}",
        f"data.steps_per_epoch={EVERY}",
        f"callbacks.last_checkpoint.every_n_train_steps={EVERY}",
        f"model.net.renderer.occupancy.update_every={EVERY}",
        "data.batch_size=256",
        "data.sampler=loss_weighted",  # its per-view weights are state that must survive the kill
        "trainer.log_every_n_steps=4",
    ]
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "victim.log"
    reference = fork_app(
        "train",
        *args,
        f"hydra.run.dir={tmp_path / 'reference'}",
        cwd=tmp_path,
        log=tmp_path / "reference.log",
    )
    victim = fork_app("train", *args, "resume=auto", cwd=work, log=log)

    # kill -9 once a checkpoint of step >= 2 * EVERY exists (the process is somewhere after it)
    runs_dir = work / "outputs" / "runs" / "train"
    deadline = time.monotonic() + 240
    killed_at = None
    while time.monotonic() < deadline and victim.is_alive():
        lasts = list(runs_dir.glob("*/checkpoints/last.ckpt"))
        step = _step_of(lasts[0]) if lasts else None
        if step is not None and step >= 2 * EVERY:
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = step
            break
        time.sleep(0.05)
    victim.join(timeout=30)
    assert killed_at is not None, "the run ended before it could be killed\n" + log.read_text()[-2000:]
    assert victim.exitcode == -signal.SIGKILL
    (run_dir,) = list(runs_dir.iterdir())
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_file() and not last.is_symlink()  # a real file, not Lightning's save_last="link"
    saved = read_checkpoint(last)  # weights-only: plain data
    assert EVERY * 2 <= saved["global_step"] < STEPS and not (run_dir / "metrics.json").exists()

    # the same command again: continues in the same folder, from last.ckpt
    resumed = fork_app("train", *args, "resume=auto", cwd=work, log=tmp_path / "resumed.log")
    resumed.join(timeout=240)
    out = (tmp_path / "resumed.log").read_text()
    assert resumed.exitcode == 0, out[-3000:]
    assert f"resume=auto: continuing {run_dir}" in out.replace("\n", "")
    assert list(runs_dir.iterdir()) == [run_dir]
    reference.join(timeout=240)
    assert reference.exitcode == 0, (tmp_path / "reference.log").read_text()[-3000:]

    ref_dir = tmp_path / "reference"
    a = read_checkpoint(ref_dir / "checkpoints" / "last.ckpt")
    b = read_checkpoint(last)
    assert a["global_step"] == b["global_step"] == STEPS
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert any(k.endswith("occupancy.density_grid") for k in b["state_dict"])
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), f"{k} differs after resume"
    for sa, sb in zip(
        a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values(), strict=True
    ):
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert a["lr_schedulers"] == b["lr_schedulers"]
    (dm_key,) = [k for k in a if k.endswith("DataModule")]
    dm_a, dm_b = dict(a[dm_key]), dict(b[dm_key])
    assert dm_b.pop(FINGERPRINT_KEY) == dm_a.pop(FINGERPRINT_KEY)  # the same capture's views (strings)
    torch.testing.assert_close(dm_b, dm_a, rtol=0, atol=0)  # sampler weights and RNG
    metrics_a = json.loads((ref_dir / "metrics.json").read_text())
    metrics_b = json.loads((run_dir / "metrics.json").read_text())
    assert metrics_b["steps"] == STEPS
    assert metrics_b["val/psnr"] == metrics_a["val/psnr"]
    # the CSV log of the killed process is continued, not replaced
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert min(steps) < saved["global_step"] and max(steps) >= STEPS - 4


def _writer(path: str, ready, stalled, big: torch.Tensor) -> None:
    """Save a small checkpoint to ``path``, then start a 24 MB one that stalls before its rename.

    The stall is at ``fsync``: the temporary file holds the new bytes, ``path`` still the old ones.
    Killing the process there is the moment a crash loses the most. The child runs torch on one thread:
    an OpenMP pool that the parent (a pytest worker) started hangs in a forked child.
    """
    torch.set_num_threads(1)
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 1}, path)
    ready.set()

    def stall(fd: int) -> None:
        stalled.set()
        time.sleep(3600)

    os.fsync = stall  # this forked child only
    io.save_checkpoint({"state_dict": {"w": big}, "global_step": 2}, path)


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(tmp_path: Path) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("fork")  # a real process, killed with SIGKILL, without interpreter start-up
    path = tmp_path / "checkpoints" / "last.ckpt"
    ready, stalled = ctx.Event(), ctx.Event()
    big = torch.ones(6 << 20)  # 24 MB
    proc = ctx.Process(target=_writer, args=(str(path), ready, stalled, big))
    proc.start()
    assert ready.wait(timeout=60) and stalled.wait(timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    partial = list(path.parent.glob(".last.ckpt.*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size > 24 << 20  # the new bytes, never renamed
    ckpt = read_checkpoint(path)  # the previous complete checkpoint, intact
    assert ckpt["global_step"] == 1 and torch.equal(ckpt["state_dict"]["w"], torch.zeros(3))
    assert remove_stale_temporaries(path.parent) == partial and not list(path.parent.glob("*.tmp"))
    assert read_checkpoint(path)["global_step"] == ckpt["global_step"]


def test_find_matching_run_ignores_how_runs_were_started(tmp_path: Path) -> None:
    def make(name: str, overrides: list[str], age: float) -> Path:
        d = tmp_path / name / ".hydra"
        d.mkdir(parents=True)
        (d / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        t = time.time() - age
        os.utime(d / "overrides.yaml", (t, t))
        return d.parent

    make("old", ["trainer.max_steps=400", "resume=auto"], age=100)
    newest = make("new", ["resume=auto", "trainer.max_steps=400", "ckpt_path=last"], age=10)
    make("other", ["trainer.max_steps=500", "resume=auto"], age=1)
    assert comparable(["b=1", "resume=auto", "a=2", "hydra.run.dir=x"]) == ["a=2", "b=1"]
    assert find_matching_run(tmp_path, ["trainer.max_steps=400", "resume=auto"]) == newest
    assert find_matching_run(tmp_path, ["trainer.max_steps=300"]) is None


def test_resolve_ckpt_path(tmp_path: Path) -> None:
    from nerf_lightning.errors import UserError

    assert resolve_ckpt_path(None, "never", tmp_path) is None
    assert resolve_ckpt_path("last", "never", tmp_path) is None  # nothing yet: fresh start
    assert resolve_ckpt_path(None, "auto", tmp_path) is None
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"x")
    assert resolve_ckpt_path(None, "auto", tmp_path) == str(last)
    assert resolve_ckpt_path(None, "never", tmp_path) is None
    assert resolve_ckpt_path(str(tmp_path), "never", tmp_path / "elsewhere") == str(last)  # a run folder
    with pytest.raises(UserError, match="ckpt_path=/nope.ckpt: no such checkpoint"):
        resolve_ckpt_path("/nope.ckpt", "never", tmp_path)
    with pytest.raises(UserError, match="resume='sometimes'"):
        resolve_ckpt_path(None, "sometimes", tmp_path)


def test_read_checkpoint_errors_name_the_file(tmp_path: Path) -> None:
    import pickle

    from nerf_lightning.errors import UserError

    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": 3}, good)
    assert read_checkpoint(good)["global_step"] == 3
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:100])
    with pytest.raises(UserError, match=f"{truncated}: not a readable checkpoint"):
        read_checkpoint(truncated)
    objects = tmp_path / "objects.ckpt"  # a pickled Python object, as the old hparams factories were
    torch.save({"state_dict": {}, "hyper_parameters": {"field": pickle.PickleError}}, objects)
    with pytest.raises(UserError, match="weights-only load refuses"):
        read_checkpoint(objects)
    with pytest.raises(UserError, match="no such checkpoint file"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_files_that_are_no_checkpoint_are_said_to_be_none(tmp_path: Path) -> None:
    """Never a traceback, and never the advice to load an unknown file without the weights-only guard."""
    import pickle
    import zipfile

    from nerf_lightning.errors import UserError

    text = tmp_path / "notes.ckpt"  # a text file renamed .ckpt (torch.load: KeyError / IndexError)
    text.write_text("step 20000: val/psnr 35.1\n" * 20)
    binary = tmp_path / "random.ckpt"
    binary.write_bytes(bytes(range(256)) * 16)
    archive = tmp_path / "archive.ckpt"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("readme.txt", "hello")
    plain_pickle = tmp_path / "pickle.ckpt"
    plain_pickle.write_bytes(pickle.dumps({"state_dict": {}}))
    objects = tmp_path / "objects.ckpt"  # a torch file, not Lightning's, holding a Python class
    torch.save({"model": pickle.PickleError}, objects)
    tensors = tmp_path / "tensors.pt"
    torch.save({"w": torch.ones(2)}, tensors)
    for path in (text, binary, archive, plain_pickle, objects, tensors):
        with pytest.raises(UserError) as err:
            read_checkpoint(path)
        message = str(err.value)
        assert message.startswith(f"{path}: not a nerf_lightning checkpoint ("), message
        assert "weights_only=False" not in message and "older nerf_lightning" not in message
        assert "\n" not in message
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="an empty file, not a readable checkpoint"):
        read_checkpoint(empty)
    lightning = tmp_path / "lightning.ckpt"  # Lightning's layout with a pickled object in it
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6", "hp": pickle.PickleError}, lightning)
    with pytest.raises(UserError) as err:
        read_checkpoint(lightning)
    assert "a Lightning checkpoint holding Python objects (pickle.PickleError)" in str(err.value)
    assert "weights_only=False" not in str(err.value)


class _StopAfter(L.Callback):
    """Ends ``fit`` after optimizer step ``step`` (as a preempted job would, checkpointing at the end)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def test_resume_with_learned_poses_and_exposure_is_exact(tiny_scene: Path, tmp_path: Path) -> None:
    """A run with pose corrections and exposures (budgeted step, their own Adam groups, the camera
    group's own schedule) stopped half-way and resumed from last.ckpt ends bit-identical to the
    uninterrupted run: corrections, exposures, their optimizer moments and learning rates included.
    The checkpoint loads with weights_only=True, and the refined poses are written next to the run."""
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.apps.train import train
    from nerf_lightning.data.formats import load_capture
    from nerf_lightning.run.config import compose_train_config

    args = [
        *TINY_TRAIN,
        f"data.path={tiny_scene}",
        "trainer.max_steps=12",
        "data.batch_size=256",
        "model.net.step.sample_budget=4096",  # the fixed-budget step: view ids are one of its inputs
        "model.net.step.n_rays_init=128",
        "model.net.camera_opt.enabled=true",
        "model.net.camera_opt.decay_steps=8",
        "model.net.appearance.enabled=true",
        "model.net.appearance.bias=true",
        "model.heldout_fit.enabled=false",  # what is resumed, not the final evaluation's fit of its views
        "trainer.check_val_every_n_epoch=1000",
    ]
    torch.set_num_threads(1)
    try:
        whole = tmp_path / "whole"
        train(compose_train_config(args, whole))
        split = tmp_path / "split"
        train(compose_train_config(args, split), extra_callbacks=[_StopAfter(6)])
        assert read_checkpoint(split / "checkpoints" / "last.ckpt")["global_step"] == 6
        train(compose_train_config([*args, f"ckpt_path={split}/checkpoints/last.ckpt"], split))
    finally:
        GlobalHydra.instance().clear()
    a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(split / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 12
    for key in ("camera_opt.adjustment", "camera_opt.gauge", "appearance.log_gain", "appearance.offset"):
        assert key in a["state_dict"], key
    assert float(a["state_dict"]["camera_opt.adjustment"].abs().max()) > 0  # they were trained
    assert float(a["state_dict"]["appearance.log_gain"].abs().max()) > 0
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), f"{k} differs after resume"
    groups_a, groups_b = a["optimizer_states"][0]["param_groups"], b["optimizer_states"][0]["param_groups"]
    assert [g.get("name") for g in groups_a] == ["table", "mlp", "camera_opt", "appearance"]
    assert [g["lr"] for g in groups_a] == [g["lr"] for g in groups_b]
    assert groups_a[2]["lr"] == pytest.approx(1e-4)  # the camera group's own decay ended at step 8
    states_a, states_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    for sa, sb in zip(states_a.values(), states_b.values(), strict=True):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    # the refined training poses, readable as a capture
    refined = load_capture(split / "refined", test_every=8)
    original = load_capture(tiny_scene, test_every=8)
    assert len(refined.train) == len(original.train) and len(refined.val) == len(original.val)
    metrics = json.loads((split / "metrics.json").read_text())
    assert metrics["camera_opt/rotation_deg_max"] > 0 and "appearance/stops_std" in metrics


@pytest.mark.slow
def test_a_resumed_run_reports_the_training_time_of_both_processes(tiny_scene: Path, compose_cfg) -> None:
    """20 steps, then the same run continued to 40 (``ckpt_path=last``): ``time/train_s`` of the second
    metrics.json is the first process's training time (stored in ``last.ckpt``) plus the second's."""
    torch.set_num_threads(2)
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "logger=none"]
    first = train(compose_cfg(*args, "trainer.max_steps=20"))
    last = Path(compose_cfg(*args).paths.output_dir) / "checkpoints" / "last.ckpt"
    stored = read_checkpoint(last)["callbacks"]["ThroughputMonitor"]["train_s"]
    assert stored >= first["time/train_s"] > 0  # its write at the end follows the training loop's last step
    assert first["time/train_s"] == first["time/train_s_this_process"]
    second = train(compose_cfg(*args, "trainer.max_steps=40", "ckpt_path=last"))
    assert second["steps"] == 40
    this = second["time/train_s_this_process"]
    assert 0 < this and second["time/train_s"] == pytest.approx(stored + this)
