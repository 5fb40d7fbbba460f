"""Issue 49's GPU call (``benchmarks/big_captures_gpu.sh``): the size of its generated capture, auto's choice
read from the runs' logs, its summary, and the script end to end on generated scenes on the CPU."""

from __future__ import annotations

import json
import logging
import os
import tarfile
from pathlib import Path

import pytest
import torch
from gpu_scripts import TINY, run_script

from benchmarks.big_captures import FRACTION, auto_choice, auto_gb, summarize
from nerf_lightning.data import host_pixels

GB = 10**9


def test_the_generated_capture_exceeds_autos_limit_unless_the_host_memory_bounds_it() -> None:
    # 1.1x auto's limit (half the free memory) when the host has room for it
    assert auto_gb(84 * GB, 512 * GB) == pytest.approx(1.1 * FRACTION * 84)
    # the H100 machine (84 GB free, 128 GiB of host memory): a third of the host, still above auto's 42 GB
    assert auto_gb(84 * GB, 128 * 2**30) == pytest.approx(0.33 * 128 * 2**30 / GB)
    assert auto_gb(84 * GB, 128 * 2**30) > FRACTION * 84
    # the H200 machine: auto's limit (74 GB) is beyond what the host can hold twice: below it
    assert auto_gb(148 * GB, 128 * 2**30) < FRACTION * 148


def storage_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, nbytes: int, free: int
) -> str:
    """The line ``resolve_storage`` logs on a GPU with ``free`` bytes free (the GPU faked)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GB))
    with caplog.at_level(logging.INFO, logger="nerf_lightning.data.datamodule"):
        host_pixels.resolve_storage("host", nbytes, torch.device("cuda", 0), FRACTION)
    return caplog.records[-1].getMessage()


def test_autos_choice_is_read_from_the_line_the_run_logs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = auto_choice("...\n[x] " + storage_line(caplog, monkeypatch, nbytes=46 * GB, free=84 * GB) + "\n...")
    assert big == {"train_mb": 46000.0, "free_mb": 84000.0, "limit_mb": 42000.0, "auto": "host"}
    small = auto_choice(storage_line(caplog, monkeypatch, nbytes=256 * 10**6, free=84 * GB))
    assert small is not None and small["auto"] == "device"
    assert auto_choice("data.storage=host: host (12.0 MB of training pixels; the device is the host)") is None


def curve_json(path: Path, steps_per_s: float, psnr: float) -> None:
    path.write_text(json.dumps({"points": [{"checkpoint_s": 60.0, "train_s": 59.0, "steps": 60 * steps_per_s,
                                            "steps_per_s": steps_per_s, "psnr": psnr}]}))  # fmt: skip


def test_summary_sets_host_against_device_per_capture(tmp_path: Path) -> None:
    curve_json(tmp_path / "lego_device.json", 330.0, 35.5)
    curve_json(tmp_path / "lego_host.json", 132.0, 35.25)
    curve_json(tmp_path / "large_host.json", 100.0, 30.0)  # its device run was skipped
    (tmp_path / "generate.json").write_text(json.dumps({"path": "/x", "train_bytes": 1}))
    (tmp_path / "steps.tsv").write_text("lego_device\t0\t90\nlego_host\t0\t95\nlarge_device\tskipped\t0\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "large_host.log").write_text(
        "data.storage=host: host (46000.0 MB of training pixels; 84000.0 of 85000.0 MB free on cuda:0, "
        "limit 50 % of free)"
    )
    summary = summarize(tmp_path, logs)
    assert set(summary["runs"]) == {"lego_device", "lego_host", "large_host"}
    assert summary["lego_host_over_device_steps_per_s"] == pytest.approx(0.4)
    assert summary["lego_host_minus_device_psnr"] == pytest.approx(-0.25)
    assert "large_host_over_device_steps_per_s" not in summary
    assert summary["steps"]["large_device"] == {"exit": "skipped", "wall_s": 0}
    assert summary["auto"] == {"large": {"train_mb": 46000.0, "free_mb": 84000.0, "limit_mb": 42000.0,
                                         "auto": "host"}}  # fmt: skip


# the whole script end to end on the CPU (tens of seconds): make test-repro, as CI runs it
@pytest.mark.repro
def test_the_gpu_script_runs_on_the_cpu(tmp_path: Path) -> None:
    from nerf_lightning.data.synthetic import generate_scene

    lego = generate_scene(tmp_path / "lego", n_views=8, width=24, height=24, supersample=1).parent
    out = tmp_path / "out"
    proc = run_script("big_captures_gpu.sh", lego, out, work=tmp_path / "work", EXTRA=TINY,
                      LEGO_ARGS="experiment=cpu", RUNS="lego_host large_host", SECONDS_AT="2",
                      LARGE_GB="0.002", LARGE_VIEWS="8", LARGE_W="32", LARGE_H="24",
                      LARGE_ROOT=str(tmp_path / "large"), RATE_HOST="4", LARGE_RATE_HOST="4")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = ["generate.json", "large_host.json", "lego_host.json", "logs.tgz", "steps.tsv", "summary.json"]
    assert sorted(os.listdir(out)) == files  # what comes back from the GPU machine: at most 8
    generated = json.loads((out / "generate.json").read_text())
    assert generated["frames"] == 8 * generated["repeat"] and generated["train_bytes"] >= 0.002 * GB
    summary = json.loads((out / "summary.json").read_text())
    for run in ("lego_host", "large_host"):
        point = summary["runs"][run]
        assert point["steps"] > 0 and point["psnr"] > 5, point
        assert summary["steps"][run]["exit"] == "0"
    with tarfile.open(out / "logs.tgz") as tar:
        logs = {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    # the data module's choice is logged (on a CPU: "the device is the host")
    assert "data.storage=host: host" in logs["large_host.log"]
