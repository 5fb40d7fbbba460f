"""The benchmark tools that train or draw on a CPU, each run end to end on the tiny scene with a few steps:
the data path (``benchmarks.data``) and captures bigger than one GPU (``benchmarks.big_captures``). What
they measure is for BENCHMARKS.md; here: that they run on today's package and report what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from runs import TINY

from benchmarks import big_captures, data

#: the tiny runs' own overrides: TINY without its logger, and a short final evaluation
QUICK = [o for o in TINY if not o.startswith("logger=")] + ["logger=none", "data.max_test_views=2"]


@pytest.fixture(autouse=True)
def _threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_data_path_times_the_draw_and_the_model_s_own_step(tiny_scene: Path, capsys) -> None:
    numbers = data.main(["--path", str(tiny_scene), "--steps", "2", "--", *QUICK])
    assert set(numbers) == {"decode_cold_s", "decode_cached_s", "data_s", "step_s"}
    assert all(v > 0 for v in numbers.values())
    table = capsys.readouterr().out
    assert "rays per step" in table and "512" in table  # data.batch_size of QUICK
    assert "frames decoded" in table and "24" in table  # the tiny scene's 24 frames, train and val


def test_big_captures_memory_generate_and_the_host_path(tmp_path: Path, tiny_scene: Path, capsys) -> None:
    big_captures.main(["memory", "--views", "8", "--width", "16", "--height", "12", "--root", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith(("| 1 ", "| 2 ", "| 4 "))]
    # 7 training views (1 of 8 held out) of 16x12 RGBA: 5376 bytes on one rank; each of 4 ranks holds 1-2
    assert rows[0].startswith("| 1 | 0.01 / 0.01 MB | 7 of 7 | 1.000 |")
    assert rows[2].split("|")[3].strip() == "2/2/2/1 of 7"
    big_captures.main(["generate", "--gb", "1e-5", "--views", "8", "--width", "16", "--height", "12",
                       "--root", str(tmp_path / "gen"), "--json", str(tmp_path / "gen.json")])  # fmt: skip
    info = json.loads((tmp_path / "gen.json").read_text())
    # 7 training frames of 16x12 RGBA a round: 5376 bytes; 1e4 bytes take 2 rounds
    assert (info["repeat"], info["frames"], info["train_bytes"]) == (2, 16, 10752)
    assert capsys.readouterr().out.splitlines()[-1] == info["path"]
    draws = big_captures.draw_overhead(tiny_scene, rays=64, draws=2, rounds=1)
    assert draws[0]["device_ms"] > 0 and draws[0]["host_ms"] > 0
    rows = big_captures.overhead(2, 1, [f"data.path={tiny_scene}", *QUICK], tmp_path / "overhead")
    assert rows[0]["device"] > 0 and rows[0]["host"] > 0
    assert rows[0]["host_over_device"] == pytest.approx(rows[0]["host"] / rows[0]["device"])
