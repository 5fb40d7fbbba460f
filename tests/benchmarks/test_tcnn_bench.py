"""``python -m benchmarks.tcnn --dry-run`` on a CPU: every row runs at toy sizes, tcnn's cells
say why tcnn cannot run here, and the markdown for BENCHMARKS.md carries the command and the auto
verdict. (The numbers are measured on the GPU: docs/tcnn.md.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import readers
from benchmarks import tcnn as bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run on a CPU")
def test_dry_run_measures_ours_and_says_why_tcnn_is_absent(tmp_path: Path) -> None:
    md, js = tmp_path / "tcnn.md", tmp_path / "tcnn.json"
    assert bench.main(["--dry-run", "--markdown", str(md), "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["rows"]
    names = [r["name"] for r in rows]
    assert names == [
        "hash enc fwd+bwd 2^10 pts, float32 table",
        "hash enc fwd+bwd 2^10 pts, float16 table",
        "hash enc fwd+bwd 2^12 pts, float32 table",
        "hash enc fwd+bwd 2^12 pts, float16 table",
        "train step 2^10 smp, 32-true",
    ]
    assert all(isinstance(r["torch"], float) and r["torch"] > 0 for r in rows)
    assert all(r["tcnn"] == "no CUDA GPU" for r in rows)
    text = md.read_text().splitlines()
    assert "`python -m benchmarks.tcnn --dry-run --markdown" in text[0]
    assert text[2] == "| benchmark | unit | torch (ours) | tcnn | tcnn / ours |"
    assert text[-1].startswith("auto keeps our kernels here")
    # the benchmark runner's reader of that file: one row per benchmark, no ratio without tcnn
    (js.parent / "tcnn.json").write_text(js.read_text())
    read = readers.tcnn_json(js.parent, tmp_path / "log")
    assert [r["part"] for r in read][:2] == ["@hash_enc_fwd_bwd_2_10_pts_float32_table",
                                             "@hash_enc_fwd_bwd_2_10_pts_float16_table"]  # fmt: skip
    assert all(r["ratio"] is None and r["note"].endswith(", tcnn no CUDA GPU") for r in read)


def test_the_reader_divides_tcnn_by_ours(tmp_path: Path) -> None:
    rows = [
        {"name": "train step 2^18 smp, bf16-mixed, graphs", "unit": "steps/s", "cuda": 400.0, "tcnn": 300.0}
    ]
    (tmp_path / "tcnn.json").write_text(json.dumps({"rows": rows}))
    (row,) = readers.tcnn_json(tmp_path, tmp_path / "log")
    assert row["part"] == "@train_step_2_18_smp_bf16_mixed_graphs" and row["ratio"] == 0.75
    assert row["note"] == "tcnn 300 vs ours 400 steps/s"


def test_without_a_gpu_only_the_dry_run_runs(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert bench.main([]) == 2
    assert "--dry-run checks the script here" in capsys.readouterr().err


def test_a_graphed_step_runs_in_a_child_and_a_native_abort_becomes_a_failed_cell(monkeypatch) -> None:
    """The graphed rows come from ``--graphed-step`` in a child process: its last stdout line carries the
    steps/s; a child killed inside tcnn (SIGABRT from std::terminate) leaves the benchmark running."""
    import subprocess

    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        if argv[argv.index("--graphed-step") + 1] == "cuda":
            return subprocess.CompletedProcess(argv, 0, "[log] something\nsteps/s 412.5\n", "")
        err = (
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  multi_stream.h:83 cudaEventRecord(m_event, m_stream) failed\n"
            "Fatal Python error: Aborted\n"
        )
        return subprocess.CompletedProcess(argv, -6, "", err)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert bench.graphed_step_in_child("cuda", "bf16-mixed", 1 << 18, 20, dry=False) == 412.5
    failed = bench.graphed_step_in_child("tcnn", "bf16-mixed", 1 << 18, 20, dry=True)
    assert failed.startswith("failed: exit -6: what():  multi_stream.h:83 cudaEventRecord"), failed
    assert calls[0][-6:] == ["cuda", "bf16-mixed", "--budget", "262144", "--iters", "20"]
    assert calls[1][-1] == "--dry-run"
