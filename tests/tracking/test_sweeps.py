"""End to end (CPU, tiny scene): a Hydra multirun with offline W&B runs and the sweep summary; Optuna.

Each test runs ``python -m nerf_lightning.train``'s ``main()`` in a process of its own (forked from the
test process: no interpreter start-up) in ``tmp_path`` (Hydra writes ``outputs/multirun/...`` relative
to the working directory), with no W&B key and a private HOME so that W&B must fall back to offline by
itself.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from runs import fork_app

from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.tracking.wandb_offline import read_offline_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scene")
    generate_scene(out, n_views=8, width=24, height=24, supersample=1)
    return out


def tiny_overrides(scene: Path) -> list[str]:
    return [
        f"data.path={scene}", "data.batch_size=256", "data.steps_per_epoch=6", "trainer.max_steps=6",
        "model.net.renderer.occupancy.resolution=16", "model.net.field.encoding.n_levels=4",
        "model.net.field.encoding.max_resolution=64", "model.net.renderer.step_size=0.02",
        "model.net.renderer.max_samples_per_ray=64",
        "model.net.renderer.occupancy.warmup_steps=4", "trainer.check_val_every_n_epoch=1000",
        "callbacks.progress_bar=null",
        "accelerator=cpu", "trainer.log_every_n_steps=3", "trainer.enable_model_summary=false",
        "callbacks.model_checkpoint=null", "model.net.step.sample_budget=null",
    ]


def run_train(args: list[str], cwd: Path) -> str:
    """Run the training entry point with ``args``; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env["HOME"] = str(cwd / "home")  # no ~/.netrc: W&B has no key and must go offline on its own
    env["NERF_LIGHTNING_CACHE"] = str(cwd / "cache")
    (cwd / "home").mkdir(exist_ok=True)
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    proc = fork_app("train", *args, cwd=cwd, log=out, err_log=err, env=env)
    proc.join(timeout=400)
    if proc.is_alive():
        proc.kill()
        proc.join()
    assert proc.exitcode == 0, (
        f"train failed ({proc.exitcode}):\n{out.read_text()[-4000:]}\n{err.read_text()[-6000:]}")
    return out.read_text()


def sweep_dir(cwd: Path) -> Path:
    dirs = sorted((cwd / "outputs" / "multirun" / "train").iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_multirun_offline_wandb_and_summary(tiny_scene: Path, tmp_path: Path) -> None:
    # The spelling `model.encoding.*` is accepted for `model.net.field.encoding.*`.
    out = run_train(["-m", "model.encoding.log2_hashmap_size=11,12", "logger=wandb",
                     *tiny_overrides(tiny_scene)], tmp_path)
    sweep = sweep_dir(tmp_path)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1"]

    groups = set()
    for job, size in zip(jobs, (11, 12), strict=True):
        overrides = list(OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        assert f"model.net.field.encoding.log2_hashmap_size={size}" in overrides
        metrics = json.loads((job / "metrics.json").read_text())
        assert metrics["steps"] == 6 and math.isfinite(metrics["val/psnr"])
        assert metrics["train/samples_per_s"] > 0 and metrics["perf/step_time_ms"] > 0

        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, runs  # one offline run per job, not one shared run
        run = read_offline_run(runs[0])
        groups.add(run["group"])
        assert run["name"].startswith(f"{job.name}:") and f"log2_hashmap_size={size}" in run["name"]
        # resolved config
        assert run["config"]["model"]["net"]["field"]["encoding"]["log2_hashmap_size"] == size
        perf = [row for row in run["history"] if "perf/samples_per_s" in row]
        assert len(perf) == 2 and all(row["perf/samples_per_s"] > 0 for row in perf)  # steps 3 and 6
        assert any("train/loss" in row for row in run["history"])
        assert any("sampler/effective_views" in row for row in run["history"])
        assert run["summary"]["val/panel/_type"] == "images/separated"  # GT | pred | depth | error panel
        assert run["summary"]["val/psnr"] == pytest.approx(metrics["val/psnr"], rel=1e-6)
        assert run["summary"]["train/samples_per_s"] == pytest.approx(metrics["train/samples_per_s"])
    assert groups == {f"train/{sweep.name}"}  # the two jobs are grouped together in W&B

    with (sweep / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    assert [r["sweep_overrides"] for r in rows] == ["model.net.field.encoding.log2_hashmap_size=11",
                                                    "model.net.field.encoding.log2_hashmap_size=12"]
    for r, job in zip(rows, jobs, strict=True):
        assert r["status"] == "ok"
        metrics = json.loads((job / "metrics.json").read_text())
        assert float(r["val/psnr"]) == pytest.approx(metrics["val/psnr"])
    assert "summary.csv" in out and "val/psnr" in out
    sync_lines = [line for line in out.splitlines() if "wandb sync" in line]
    # one line for the whole sweep (the jobs stay quiet), with the sweep dir as Hydra names it
    assert len(sync_lines) == 1 and str(sweep.relative_to(tmp_path)) in sync_lines[0], out[-3000:]


def test_optuna_two_trials(tiny_scene: Path, tmp_path: Path) -> None:
    # hparams_search=optuna's TPE sampler, direction and lr space; hash-grid ranges narrowed for CPU.
    run_train(["hparams_search=optuna", "hydra.sweeper.n_trials=2",
               "hydra.sweeper.sampler.n_startup_trials=1",
               "model.net.field.encoding.log2_hashmap_size=choice(10,11)",
               "model.net.field.encoding.n_levels=choice(2,4)", "logger=none",
               *[o for o in tiny_overrides(tiny_scene) if "n_levels" not in o]], tmp_path)
    sweep = sweep_dir(tmp_path)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.json").exists())
    assert len(jobs) == 2
    psnrs = []
    for job in jobs:
        overrides = dict(o.split("=", 1) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        assert 1e-3 <= float(overrides["model.optimizer.lr"]) <= 3e-2
        assert overrides["model.net.field.encoding.log2_hashmap_size"] in ("10", "11")
        assert overrides["model.net.field.encoding.n_levels"] in ("2", "4")
        psnrs.append(json.loads((job / "metrics.json").read_text())["val/psnr"])
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert results.best_value == pytest.approx(max(psnrs))  # the task returned val/psnr, maximized
    with (sweep / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)


def test_a_diverged_job_fails_alone_and_the_sweep_exits_3(tiny_scene: Path, tmp_path: Path) -> None:
    """One job of a learning-rate sweep diverges: it ends with its line and no metrics.json, the next job
    still runs to the end, and the sweep's exit status says that a job failed (3: diverged)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = fork_app("train", "-m", "model.optimizer.lr=1e30,0.01", "logger=none",
                    *tiny_overrides(tiny_scene), cwd=tmp_path, log=out, err_log=err, env=env)  # fmt: skip
    proc.join(timeout=400)
    if proc.is_alive():
        proc.kill()
        proc.join()
    stderr = err.read_text()
    assert proc.exitcode == 3, stderr[-3000:]
    jobs = sorted(p for p in sweep_dir(tmp_path).iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1"]
    assert not (jobs[0] / "metrics.json").exists()
    assert math.isfinite(json.loads((jobs[1] / "metrics.json").read_text())["val/psnr"])
    assert "error: training diverged" in stderr and "1 job(s) of the sweep failed" in stderr
