"""The benchmark runner on the CPU: its table of experiments, the exact command lines, a real tiny
experiment, and jobs that fail, overrun, are skipped or share the machine in lanes."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from runs import child_env

from benchmarks import readers
from benchmarks.experiments import EXPERIMENTS
from benchmarks.jobs import Experiment, Job, ab, command, in_lanes, phases
from benchmarks.suite import Suite, format_table, main, with_baselines

PLACEHOLDER = re.compile(r"\{(python|data|work|exp_dir|run_dir)\}")


@pytest.fixture
def child_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's children see this checkout's sources, one thread each, no W&B."""
    for key, value in child_env().items():
        monkeypatch.setenv(key, value)


def _py(code: str) -> tuple[str, ...]:
    return ("{python}", "-c", code)


# -------------------------------------------------------------------------------------- the table
def test_dry_run_prints_every_jobs_exact_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data, work = tmp_path / "data", tmp_path / "w"
    assert main([*EXPERIMENTS, "--dry-run", "--data", str(data), "--work", str(work)]) == 0
    out = capsys.readouterr().out
    assert not PLACEHOLDER.search(out), "a placeholder was not filled in"
    for exp in EXPERIMENTS.values():
        assert f"== {exp.name}: " in out
        for job in exp.jobs:
            assert f"-- {job.name} [" in out
    # the command BENCHMARKS.md quotes for lego's time points, with this interpreter and these folders
    lego, curve_dir = data / "lego", work / "lego-curve" / "curve"
    assert (
        f"{sys.executable} -m nerf_lightning.bench.curve --checkpoints 15,60,300 --rate 330 --tolerance 1 "
        f"--out {curve_dir} -- experiment=blender data.path={lego} logger=csv"
    ) in out
    run = work / "fruit-2k-seeds" / "fruit_no_gs_s8"
    assert (
        "-m nerf_lightning.train logger=csv callbacks.progress_bar=null "
        "trainer.check_val_every_n_epoch=100000 callbacks.model_checkpoint=null "
        f"callbacks.last_checkpoint=null data.path={data / 'fruit'} "
        "model.net.renderer.gradient_scaling_distance=null "
        f"trainer.max_steps=2000 seed=8 hydra.run.dir={run}"
    ) in out
    assert "(missing under" in out  # no captures in the empty data folder: those jobs would be skipped


def test_experiments_have_unique_job_names_paired_baselines_and_sane_time_boxes() -> None:
    for exp in EXPERIMENTS.values():
        names = [j.name for j in exp.jobs]
        assert len(names) == len(set(names)), exp.name
        for job in exp.jobs:
            assert 0 < job.expected_s < job.timeout_s, (exp.name, job.name)
            assert job.baseline is None or job.baseline in names, (exp.name, job.name)
            # an A/B's paired job is the baseline at the same seed
            seed = re.search(r"_s(\d+)$", job.name)
            if job.baseline and seed and re.search(r"_s\d+$", job.baseline):
                assert job.baseline.endswith(f"_s{seed.group(1)}"), (exp.name, job.name)
            if job.lane is not None:
                assert job.gpus <= 1, "lanes share one GPU"
    # what fits one 10-minute machine slot, with the extension load in front, unless it says otherwise
    for exp in EXPERIMENTS.values():
        if exp.gpus and "min" not in exp.summary:
            assert exp.expected_s() < 540, exp.name


def _train_overrides(job: Job) -> list[str]:
    argv = list(job.argv)
    if "nerf_lightning.train" in argv:
        rest = argv[argv.index("nerf_lightning.train") + 1 :]
    elif "nerf_lightning.bench.curve" in argv:
        rest = argv[argv.index("--") + 1 :]
    else:
        return []
    return [a for a in rest if not a.startswith(("hydra.", "seed=", "trainer.max_steps="))]


def test_every_training_override_of_the_table_composes(tmp_path: Path) -> None:
    """Each key=value that some job passes to training composes with the shipped config (one value per key
    per composition, so a few compositions check them all)."""
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.apps.entry import normalize_argv
    from nerf_lightning.run.config import compose_train_config

    values: dict[str, list[str]] = {}
    for exp in EXPERIMENTS.values():
        for job in exp.jobs:
            for ov in _train_overrides(job):
                key = ov.split("=", 1)[0]
                if ov not in values.setdefault(key, []):
                    values[key].append(ov)
    assert {"precision", "strategy", "data.sampler", "batch_rule._target_"} <= set(values)
    rounds = max(len(v) for v in values.values())
    fill = {"{data}": str(tmp_path / "data"), "{exp_dir}": str(tmp_path / "exp")}
    for i in range(rounds):
        overrides = [v[i % len(v)] for v in values.values()]
        overrides = [re.sub(r"\{\w+\}", lambda m: fill.get(m.group(0), m.group(0)), o) for o in overrides]
        try:  # as `python -m nerf_lightning.train` reads its command line (precision=32 is a group choice)
            cfg = compose_train_config(normalize_argv(overrides), tmp_path / f"c{i}")
        finally:
            GlobalHydra.instance().clear()
        assert cfg.model.net.field.encoding.log2_hashmap_size in (10, 12, 19, 20, 21, 24)


def test_the_gpu_tests_leave_the_viewer_out_where_viser_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuda-tests`` on a machine without viser (a GPU machine given only some wheels) names the viewer's
    tests to leave out, instead of failing the whole collection on their imports; with viser it runs all."""
    import importlib
    import importlib.util

    import benchmarks.experiments as experiments

    real = importlib.util.find_spec
    no_viser = lambda name, *a: None if name == "viser" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", no_viser)
    try:
        without = importlib.reload(experiments).EXPERIMENTS["cuda-tests"].jobs[0].argv
    finally:
        monkeypatch.undo()
        with_viser = importlib.reload(experiments).EXPERIMENTS["cuda-tests"].jobs[0].argv
    assert without[-3:] == (
        "tests",
        "--ignore=tests/viewer",
        "--ignore=tests/benchmarks/test_viewer_bench.py",
    )
    assert with_viser[-3:] == ("-m", "cuda", "tests")


# ------------------------------------------------------------------------------------ running jobs
def test_cpu_smoke_experiment_runs_for_real(tmp_path: Path, child_environment: None) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["cpu-smoke", "--out", str(out), "--work", str(work)]) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["cpu-smoke/scene", "cpu-smoke/tiny", "cpu-smoke/tiny_t10"]
    assert all(r["status"] == "ok" and r["rc"] == 0 for r in rows)
    scene, tiny, small = rows
    assert (work / "cpu-smoke" / "scene" / "transforms.json").is_file()
    metrics = json.loads((work / "cpu-smoke" / "tiny" / "metrics.json").read_text())
    assert tiny["psnr"] == metrics["val/psnr"] and tiny["steps"] == metrics["steps"] == 8
    assert tiny["steps_per_s"] == pytest.approx(8 / metrics["time/train_s"])
    assert small["baseline"] == "tiny" and small["d_psnr"] == pytest.approx(small["psnr"] - tiny["psnr"])
    assert "ratio" not in small  # lane jobs: no speed ratio
    assert tiny["mode"] == "lane0" and small["mode"] == "lane1" and scene["mode"] == "alone"
    table = (out / "table.txt").read_text()
    assert "cpu-smoke/tiny_t10" in table and f"{small['psnr']:.3f}" in table
    assert "cpu-smoke/tiny ok in" in (out / "progress.txt").read_text()
    import tarfile

    with tarfile.open(out / "runs.tgz") as tar:
        assert "cpu-smoke/tiny/metrics.json" in tar.getnames()


def test_failures_timeouts_and_skips_never_stop_the_other_jobs(tmp_path: Path) -> None:
    exp = Experiment("t", "failure modes", (
        command("fails", *_py("import sys; print('out of cheese'); sys.exit(3)"), gpus=0, expected_s=1),
        command("hangs", *_py("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                               "time.sleep(60)"), gpus=0, expected_s=0.1, timeout_s=1),
        command("no_results", *_py("pass"), read=readers.metrics_json, gpus=0, expected_s=0.1),
        command("gpu", *_py("pass"), gpus=1, expected_s=0.1),
        command("too_long", *_py("pass"), gpus=0, expected_s=1e6, timeout_s=2e6),
        command("bad_reader", *_py("pass"), read=lambda run_dir, log: [{"psnr": 1 / 0}], gpus=0,
                expected_s=0.1),
        command("fine", *_py("print('ok')"), gpus=0, expected_s=0.1),
    ))  # fmt: skip
    suite = Suite(tmp_path / "out", tmp_path / "work", tmp_path / "data", limit=600)
    suite.grace_s = 0.5
    t0 = time.time()
    suite.run_experiment(exp)
    assert time.time() - t0 < 30
    assert suite.finish() == 1
    rows = {r["job"]: r for r in map(json.loads, (tmp_path / "out" / "rows.jsonl").read_text().splitlines())}
    assert rows["fails"]["status"] == "failed" and rows["fails"]["rc"] == 3
    assert "rc=3" in rows["fails"]["note"] and "out of cheese" in rows["fails"]["note"]
    assert rows["fails"]["log_tail"] == ["out of cheese"]
    # SIGTERM ignored: SIGKILL after the grace period
    assert rows["hangs"]["status"] == "timeout" and rows["hangs"]["rc"] == -9 and rows["hangs"]["wall_s"] < 10
    assert rows["no_results"]["status"] == "failed" and "no metrics.json" in rows["no_results"]["note"]
    assert rows["gpu"]["status"] == "skipped" and "needs 1 GPU" in rows["gpu"]["note"]
    assert rows["too_long"]["status"] == "skipped" and rows["too_long"]["note"].startswith("time:")
    assert rows["bad_reader"]["status"] == "failed" and "ZeroDivisionError" in rows["bad_reader"]["note"]
    assert rows["fine"]["status"] == "ok" and rows["fine"]["rc"] == 0


def test_lanes_run_side_by_side_and_alone_jobs_one_at_a_time(tmp_path: Path) -> None:
    sleep = _py("import time; time.sleep(1.5)")
    jobs = (
        command("first", *sleep, gpus=0, expected_s=1.5),
        *in_lanes([command(f"lane_{i}", *sleep, gpus=0, expected_s=1.5) for i in range(3)]),
        command("last", *sleep, gpus=0, expected_s=1.5),
    )
    assert [len(b) for b in phases(jobs)] == [1, 3, 1]
    suite = Suite(tmp_path / "out", tmp_path / "work", tmp_path, limit=None)
    suite.run_experiment(Experiment("t", "lanes", jobs))
    rows = {r["job"]: r for r in suite.rows}
    start = {k: time.mktime(time.strptime(r["started"], "%Y-%m-%dT%H:%M:%S")) for k, r in rows.items()}
    lanes = [start[f"lane_{i}"] for i in range(3)]
    assert max(lanes) - min(lanes) <= 1, "the three lanes start together"
    assert min(lanes) >= start["first"] + 1 and start["last"] >= max(lanes) + 1, "alone jobs wait"


def test_in_lanes_balances_expected_time_in_order() -> None:
    jobs = [Job(f"j{i}", ("true",), expected_s=s) for i, s in enumerate([100, 10, 10, 10, 50])]
    # j0 -> lane 0 (100), j1 -> 1, j2 -> 2, j3 -> 1 (10 < 100, tie with lane 2 broken by index), j4 -> 2
    assert [j.lane for j in in_lanes(jobs, 3)] == [0, 1, 2, 1, 2]


def test_ab_pairs_each_variant_with_the_default_at_its_seed() -> None:
    jobs = ab("fox", {"default": (), "x": ("model.net.loss.kind=mse",)}, (1, 2), 100)
    assert [(j.name, j.baseline) for j in jobs] == [
        ("fox_default_s1", None), ("fox_x_s1", "fox_default_s1"),
        ("fox_default_s2", None), ("fox_x_s2", "fox_default_s2"),
    ]  # fmt: skip
    assert "model.net.loss.kind=mse" in jobs[1].argv and "seed=2" in jobs[3].argv


# ------------------------------------------------------------------------------ baselines, readers
def _row(job: str, part: str = "", mode: str = "alone", **kw) -> dict:
    return {"experiment": "e", "job": job, "id": f"e/{job}{part}", "part": part, "mode": mode, "status": "ok",
            "seq": [0, 0], **kw}  # fmt: skip


def test_baselines_pair_by_part_and_speed_ratios_need_both_jobs_alone() -> None:
    rows = with_baselines([
        _row("old", "@15s", psnr=35.0, steps_per_s=300.0), _row("old", "@60s", psnr=36.0, steps_per_s=320.0),
        _row("new", "@15s", psnr=35.5, steps_per_s=360.0, baseline="old"),
        _row("new", "@60s", psnr=36.2, steps_per_s=400.0, baseline="old"),
        _row("lane", psnr=34.0, steps_per_s=100.0, mode="lane1", baseline="old"),
        _row("mem", mem_gb=4.8, baseline="old_mem", ratio_of="mem_gb"), _row("old_mem", mem_gb=6.4),
    ])  # fmt: skip
    by_id = {r["id"]: r for r in rows}
    assert by_id["e/new@15s"]["d_psnr"] == pytest.approx(0.5) and by_id["e/new@15s"]["ratio"] == 1.2
    assert by_id["e/new@60s"]["d_psnr"] == pytest.approx(0.2) and by_id["e/new@60s"]["ratio"] == 1.25
    assert by_id["e/lane"]["d_psnr"] == pytest.approx(-1.0) and "ratio" not in by_id["e/lane"]
    assert by_id["e/mem"]["ratio"] == pytest.approx(0.75)
    table = format_table(rows)
    assert "1.25x" in table and "+0.500" in table
    lane_line = next(line for line in table.splitlines() if line.startswith("e/lane "))
    assert "100.0" not in lane_line  # a lane's steps/s is not shown


def test_readers_take_their_numbers_from_the_tools_files(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("....\nFAILED tests/ops/test_x.py::test_y - assert 1 == 2\n"
                   "== 1 failed, 189 passed, 411 deselected in 29.12s ==\n")  # fmt: skip
    (row,) = readers.pytest_summary(tmp_path, log)
    assert row["tests"] == {"failed": 1, "passed": 189, "deselected": 411}
    assert row["failed_tests"] == ["tests/ops/test_x.py::test_y"]
    (tmp_path / "metrics.json").write_text(json.dumps({
        "val/psnr": 36.5, "val/ssim": 0.98, "steps": 20000, "time/train_s": 50.0, "train/rays_per_s": 1.5e7,
        "gpu/utilization_mean": 88.0, "gpu/mem_peak_gb": 0.7, "test/psnr": 36.4,
    }))  # fmt: skip
    (m,) = readers.metrics_json(tmp_path, log)
    assert (m["psnr"], m["steps_per_s"], m["rays_per_s"], m["gpu_util"]) == (36.5, 400.0, 1.5e7, 88.0)
    assert "test 36.400 dB" in m["note"]
    (tmp_path / "curve.json").write_text(json.dumps({"points": [
        {"checkpoint_s": 15, "psnr": 35.4, "steps": 4950, "train_s": 12.1, "steps_per_s": 409.0,
         "bin_steps_per_s_min": 303.0, "bin_steps_per_s_max": 420.0,
         "timeline": [{"gpu_utilization": 47.0}, {"gpu_utilization": 97.0}]},
    ]}))  # fmt: skip
    (c,) = readers.curve_json(tmp_path, log)
    assert c["part"] == "@15s" and c["psnr"] == 35.4 and c["note"] == "bins 303-420 steps/s, 47-97 % busy"
    (tmp_path / "ops.json").write_text(json.dumps({"results": [
        {"name": "hash encoding fwd+bwd, 2^18 random points", "unit": "points/s", "reference": 1.31e7,
         "cuda": 2.81e8},
    ]}))  # fmt: skip
    (o,) = readers.ops_json(tmp_path, log)
    assert o["part"] == "@hash_encoding_fwd_bwd_2_18_random_points"
    assert o["ratio"] == pytest.approx(2.81e8 / 1.31e7)
    (tmp_path / "peers.jsonl").write_text('{"tag": "lego_60s", "psnr_srgb_white": 33.3}\n\n{"tag": "x"}\n')
    rows = readers.jsonl("peers.jsonl", psnr="psnr_srgb_white")(tmp_path, log)
    assert [(r["part"], r["psnr"]) for r in rows] == [("@lego_60s", 33.3), ("@x", None)]
    with pytest.raises(FileNotFoundError):
        readers.census_json(tmp_path, log)


def test_census_says_it_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from benchmarks import census

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench.census measures instead")
    assert census.main(["--precision", "bf16-mixed"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
