"""A command refused by a finished run, or one that finds nothing left to do, leaves it byte-identical.

Real ``train`` processes (``runs.fork_app``) into a copy of the shared short training, made to look like
a finished run of the command line (``.hydra/``, ``train.log``, the ``.lock`` of a run that died): a bad
value, a model that does not fit the checkpoint, other image sizes, a checkpoint with NaN weights and a
resume of the finished run each end with one line and the right status, and every file of the folder
is as it was (no ``.hydra/`` rewritten, no lock record, no metrics). A resumed run's progress bar
counts to its total.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from runs import TINY, TINY_TRAIN, TRAINED_STEPS, fork_app

from nerf_lightning.apps.train import train
from nerf_lightning.errors import EXIT_USER_ERROR

pytestmark = pytest.mark.slow

#: what the .lock of a run killed with SIGKILL holds (its process is gone)
DEAD_RUN = b'{"pid": 999999, "host": "node7", "started": "2026-12-01 08:00:00"}\n'


def _command(scene: Path, *extra: str) -> list[str]:
    """The shared training's command line, with ``extra`` replacing the values of the keys it sets."""
    keys = {e.split("=", 1)[0] for e in extra}
    base = ["experiment=null", f"data.path={scene}", f"trainer.max_steps={TRAINED_STEPS}", *TINY]
    return [a for a in base if a.split("=", 1)[0] not in keys] + list(extra)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(trained_run, tiny_scene: Path, tmp_path: Path) -> Path:
    """A copy of the shared training with the record a command-line run leaves next to its outputs."""
    run = tmp_path / "finished"
    shutil.copytree(trained_run[0], run, ignore=shutil.ignore_patterns(".hydra", "*.log", ".lock"))
    (run / ".hydra").mkdir()
    overrides = "".join(f"- {a}\n" for a in _command(tiny_scene))
    (run / ".hydra" / "overrides.yaml").write_text(overrides)
    (run / ".hydra" / "config.yaml").write_text("seed: 42\n")
    (run / "train.log").write_text("[2026-12-01 08:00:00][nerf_lightning.train][INFO] - val/psnr 20.00 dB\n")
    (run / ".lock").write_bytes(DEAD_RUN)
    return run


def _run(tmp_path: Path, *argv: str) -> tuple[int | None, str]:
    err = tmp_path / "cmd.err"
    proc = fork_app("train", *argv, cwd=tmp_path, log=tmp_path / "cmd.log", err_log=err)
    proc.join(timeout=300)
    if proc.is_alive():
        proc.kill()
    return proc.exitcode, err.read_text() if err.exists() else ""


@pytest.fixture
def nan_ckpt(trained_run, tmp_path: Path) -> tuple[Path, str]:
    """The shared training's last.ckpt with NaN in one weight; (file, that weight's name)."""
    ckpt = torch.load(trained_run[0] / "checkpoints" / "last.ckpt", weights_only=True)
    name = [k for k, v in ckpt["state_dict"].items() if v.is_floating_point()][1]
    ckpt["state_dict"][name].view(-1)[3] = float("nan")
    path = tmp_path / "nan.ckpt"
    torch.save(ckpt, path)
    return path, name


@pytest.mark.parametrize(
    "case, extra, code, line",
    [
        ("a bad value", ["data.shard=maybe"], EXIT_USER_ERROR,
         r"error: data\.shard=maybe: expected one of True, False, auto \(auto: with several ranks\)$"),
        ("another model", ["model.net.field.encoding.log2_hashmap_size=12"], EXIT_USER_ERROR,
         r"error: ckpt_path=last: {last}: its weights do not fit this run's model \(.*\); this command "
         r"changes model\.net\.field\.encoding\.log2_hashmap_size=12 \(the checkpoint's run: 14\): drop that "
         r"override to continue the run$"),
        ("other image sizes", ["data.downscale=2"], EXIT_USER_ERROR,
         r"error: ckpt_path=last: {last}: its training views differ from this run's \(the checkpoint's "
         r"(\d+) training views are 40x40 pixels, this run's \1 are 20x20 pixels: .*\); this command changes "
         r"data\.downscale=2 \(the checkpoint's run: 1\): drop that override to continue the run$"),
        ("NaN weights", ["ckpt_path={nan}"], EXIT_USER_ERROR,
         r"error: {nan}: NaN/inf in its weights \({name}\); .*earlier checkpoint"),
        ("the same command", [], 0,
         r"{run}: this run already finished at step 120 \(trainer\.max_steps=120; {run}/metrics\.json\); "
         r"nothing was trained or written: raise trainer\.max_steps to train it further"),
    ],
)  # fmt: skip
def test_a_finished_run_is_left_byte_identical(
    case: str, extra: list[str], code: int, line: str, finished_run: Path, nan_ckpt, tiny_scene: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    nan, name = nan_ckpt
    before = _files(finished_run)
    extra = [e.format(nan=nan) for e in extra]
    resume = [] if any(e.startswith("ckpt_path=") for e in extra) else ["ckpt_path=last"]
    got, stderr = _run(tmp_path, *_command(tiny_scene, *extra), f"hydra.run.dir={finished_run}", *resume)

    assert got == code, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    said = [ln for ln in stderr.splitlines() if ln.startswith(("error: ", str(finished_run)))]
    last = finished_run / "checkpoints" / "last.ckpt"
    want = line.replace("{last}", re.escape(str(last))).replace("{run}", re.escape(str(finished_run)))
    want = want.replace("{nan}", re.escape(str(nan))).replace("{name}", re.escape(name))
    assert len(said) == 1 and re.match(want, said[0]), (said, want)
    after = _files(finished_run)
    assert sorted(after) == sorted(before)  # no .hydra/hydra.yaml, no new log, no metrics
    changed = [p for p in before if after[p] != before[p]]
    assert changed == [], changed  # .hydra/, train.log, metrics.json and the dead run's .lock included


@pytest.mark.parametrize(
    "app, args",
    [
        ("eval", []),
        ("render", ["frames=2", "width=8", "height=8", "save_frames=true"]),
        ("export", ["what=mesh", "format=glb", "texture_size=256", "faces=5000", "resolution=16"]),
        ("view", ["port=0", "max_seconds=1"]),
        ("train", ["ckpt_path={nan}", "trainer.max_steps=130"]),
    ],
)
def test_every_app_refuses_a_checkpoint_with_nan_weights(
    app: str, args: list[str], nan_ckpt, tiny_scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One line naming the file and its first non-finite weight, exit status 2 (bad input, not a
    divergence of this run), and nothing written: no mesh with NaN vertices, no NaN metrics."""
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.errors import user_errors
    from nerf_lightning.run.config import compose_app_config

    nan, name = nan_ckpt
    out = tmp_path / "out"
    if app == "train":
        overrides = [a.format(nan=nan) for a in _command(tiny_scene, *args) if a != "experiment=null"]
    else:
        overrides = [f"ckpt={nan}", "accelerator=cpu", *args]
    cfg = compose_app_config(app, overrides, out)
    run = {
        "eval": "nerf_lightning.apps.eval:evaluate",
        "render": "nerf_lightning.apps.render:render_video",
        "export": "nerf_lightning.apps.export:export",
        "view": "nerf_lightning.apps.view:view",
        "train": "nerf_lightning.apps.train:train",
    }[app]
    module, function = run.split(":")
    task = getattr(__import__(module, fromlist=[function]), function)
    try:
        with pytest.raises(SystemExit) as stop, user_errors():
            task(cfg)
    finally:
        GlobalHydra.instance().clear()
    assert stop.value.code == EXIT_USER_ERROR
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"error: {nan}: NaN/inf in its weights ({name}); expected finite weights (training never saves a "
        "diverged state): use an earlier checkpoint of that run, or train it again"
    ]
    assert not out.exists() or [p.name for p in out.rglob("*")] == []  # the export's `out` check: no file


def test_a_refused_command_into_a_new_folder_leaves_no_lock_record(tiny_scene: Path, tmp_path: Path) -> None:
    """The folder keeps the refused command's record (``.hydra/``, its log with the error line), and its
    ``.lock`` is free and empty: the next run does not take it for a run that did not finish."""
    run = tmp_path / "new"
    got, stderr = _run(tmp_path, *_command(tiny_scene, "data.shard=maybe"), f"hydra.run.dir={run}")
    assert got == EXIT_USER_ERROR, stderr[-3000:]
    assert (run / ".lock").read_bytes() == b""
    assert "error: data.shard=maybe: expected one of" in (run / "train.log").read_text()
    assert "data.shard=maybe" in (run / ".hydra" / "overrides.yaml").read_text()


class BarWatch(L.Callback):
    """(batches done, total) of the training bar's task after every step."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, str]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        bar = trainer.progress_bar_callback
        task = bar.progress.tasks[bar.train_progress_bar_id]
        self.seen.append((task.completed, task.total, str(task.description)))


def test_a_resumed_run_counts_its_progress_bar_to_its_total(tiny_scene: Path, compose_cfg) -> None:
    """25 steps (epochs of 20), then the same run continued to 35: the bar of the resumed epoch starts at
    batch 5 of 20 and ends at batch 15, the last step of the run; no ``/-2`` epoch count (no epoch limit)."""
    torch.set_num_threads(2)
    with_bar = [a for a in TINY_TRAIN if a != "callbacks.progress_bar=null"]  # the default bar
    args = [*with_bar, f"data.path={tiny_scene}", "logger=none", "trainer.log_every_n_steps=5"]
    train(compose_cfg(*args, "trainer.max_steps=25"))
    watch = BarWatch()
    metrics = train(compose_cfg(*args, "trainer.max_steps=35", "ckpt_path=last"), extra_callbacks=[watch])
    assert metrics["steps"] == 35
    assert [done for done, _, _ in watch.seen] == list(range(6, 16))
    assert {total for _, total, _ in watch.seen} == {15}
    descriptions = {description.strip() for _, _, description in watch.seen}
    assert all(re.fullmatch(r"Epoch \d+", d) for d in descriptions), descriptions
    assert json.loads((Path(compose_cfg(*args).paths.output_dir) / "metrics.json").read_text())["steps"] == 35
