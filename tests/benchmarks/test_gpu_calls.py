"""The prepared GPU calls (``benchmarks/gpu_calls.py``): each fits the machine's limits (a command of at most
2000 characters, 9 minutes, 64 MiB carried), its data are prepared as the scripts read them, and
docs/benchmarks/gpu-calls.md gives exactly the tool's commands and carry lists."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.gpu_calls import (
    CALL_S,
    CALLS,
    MAX_COMMAND,
    OUTER_TIMEOUT_S,
    RUN_TIMEOUT_S,
    carried_bytes,
    lego_subset,
    main,
    prepare,
    reencode_jpegs,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(CALLS))
def test_each_call_fits_the_machines_limits(name: str) -> None:
    call = CALLS[name]
    assert len(call.command) <= MAX_COMMAND and len(call.carry) <= 8
    assert (REPO / call.script).is_file() and call.script in call.command
    # each carried path is a folder: spelled with its slash, the ignore rules match it whether or not it
    # exists yet (a fresh clone has none of them)
    folders = [f"{path}/" for path in call.carry]
    ignored = subprocess.run(["git", "check-ignore", *folders], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.split() == folders, "a carried path not git-ignored travels twice"
    assert call.minutes * 60 <= CALL_S


def test_every_step_ends_by_the_deadline_inside_the_call() -> None:
    common = (REPO / "benchmarks" / "gpu_common.sh").read_text()
    deadline = int(re.search(r"DEADLINE_S=\$\{DEADLINE_S:-(\d+)\}", common).group(1))
    kill_after = int(re.search(r"--kill-after=(\d+)", common).group(1))
    assert deadline + kill_after <= CALL_S < OUTER_TIMEOUT_S < RUN_TIMEOUT_S


def test_the_docs_give_exactly_the_tools_commands_and_carry_lists() -> None:
    doc = (REPO / "docs" / "benchmarks" / "gpu-calls.md").read_text()
    commands = re.findall(r"^command: (.+)$", doc, flags=re.M)
    carries = [json.loads(c) for c in re.findall(r"^carry: (.+)$", doc, flags=re.M)]
    # every call of the tool is on the page, and every call on the page is one of the tool's, runnable as is
    assert commands == [call.command for call in CALLS.values()]
    assert carries == [list(call.carry) for call in CALLS.values()]
    for command in commands:
        script = re.search(r"bash (benchmarks/\S+\.sh) ", command).group(1)
        assert (REPO / script).is_file(), script


def fake_lego(root: Path) -> Path:
    for split, n in (("train", 3), ("test", 6)):
        (root / split).mkdir(parents=True)
        frames = []
        for i in range(n):
            Image.new("RGBA", (4, 4)).save(root / split / f"r_{i}.png")
            frames.append({"file_path": f"./{split}/r_{i}.png", "transform_matrix": np.eye(4).tolist()})
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": 0.7, "frames": frames}))
    return root


def test_lego_subset_keeps_training_whole_and_the_first_test_views(tmp_path: Path) -> None:
    dst = tmp_path / "subset"
    lego_subset(fake_lego(tmp_path / "lego"), dst, test_views=4)
    test = json.loads((dst / "transforms_test.json").read_text())["frames"]
    assert [f["file_path"] for f in test] == [f"./test/r_{i}.png" for i in range(4)]
    assert sorted(p.name for p in (dst / "test").iterdir()) == [f"r_{i}.png" for i in range(4)]
    assert sorted(p.name for p in (dst / "train").iterdir()) == ["r_0.png", "r_1.png", "r_2.png"]
    train_json = (tmp_path / "lego" / "transforms_train.json").read_bytes()
    assert (dst / "transforms_train.json").read_bytes() == train_json


def test_reencoded_photographs_keep_their_names_and_size(tmp_path: Path) -> None:
    src = tmp_path / "fox"
    (src / "images").mkdir(parents=True)
    noise = np.random.default_rng(0).integers(0, 256, (64, 48, 3), dtype=np.uint8)
    Image.fromarray(noise).save(src / "images" / "0001.jpg", quality=100)
    (src / "transforms.json").write_text("{}")
    reencode_jpegs(src, tmp_path / "fox_q", quality=50)
    out = tmp_path / "fox_q" / "images" / "0001.jpg"
    assert Image.open(out).size == (48, 64)
    assert out.stat().st_size < (src / "images" / "0001.jpg").stat().st_size
    assert (tmp_path / "fox_q" / "transforms.json").read_text() == "{}"


def git_repo(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    (path / ".gitignore").write_text(".whl/\n.devdata/\n")
    (path / "tracked.txt").write_bytes(b"x" * 100)
    subprocess.run(["git", "add", "."], cwd=path, check=True)
    (path / "untracked.txt").write_bytes(b"y" * 10)  # not ignored: it travels too
    return path


def test_prepare_copies_the_data_and_measures_what_travels(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    data, wheels = tmp_path / "data", tmp_path / "wheels"
    (data / "lego_official" / "train").mkdir(parents=True)
    (data / "lego_official" / "transforms_train.json").write_bytes(b"z" * 1000)
    (data / "lego_official" / "train" / "r_0.png").write_bytes(b"p" * 700)
    wheels.mkdir()
    (wheels / "hydra_core-1.3.8-py3-none-any.whl").write_bytes(b"w" * 500)
    (repo / ".devdata").mkdir()
    (repo / ".devdata" / "fox_q85").mkdir()  # another call's data: not carried by this one
    (repo / ".devdata" / "fox_q85" / "big.bin").write_bytes(b"b" * 10_000)
    sizes = prepare(repo, CALLS["storage"], data, wheels)
    gitignore = len(".whl/\n.devdata/\n")
    assert sizes == {"tree": 100 + 10 + gitignore, ".whl": 500, ".devdata/lego_official": 1700,
                     "total": 100 + 10 + gitignore + 2200}  # fmt: skip
    assert carried_bytes(repo, CALLS["storage"]) == sizes
    assert (repo / ".devdata" / "lego_official" / "train" / "r_0.png").read_bytes() == b"p" * 700


def test_show_prints_each_calls_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show"]) == 0
    out = capsys.readouterr().out
    for call in CALLS.values():
        assert f"command ({len(call.command)} chars): {call.command}" in out
