"""benchmarks.trim_capture: a Blender-layout capture cut to its first frames per split, only their images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.trim_capture import main, trim


def _capture(root: Path) -> Path:
    (root / "train").mkdir(parents=True)
    for i in range(4):
        (root / "train" / f"r_{i}.png").write_bytes(bytes([i]) * 10)
    frames = [{"file_path": f"./train/r_{i}", "transform_matrix": [[float(i)]]} for i in range(4)]
    (root / "transforms_train.json").write_text(json.dumps({"camera_angle_x": 0.7, "frames": frames}))
    val = [{"file_path": "./train/r_3.png"}]  # a val frame may name a training image, with its extension
    (root / "transforms_val.json").write_text(json.dumps({"camera_angle_x": 0.7, "frames": val}))
    return root


def test_the_first_frames_of_each_split_and_only_their_images(tmp_path: Path) -> None:
    source = _capture(tmp_path / "src")
    assert trim(source, tmp_path / "out", {"train": 2, "val": 1, "test": 5}) == 3
    train = json.loads((tmp_path / "out" / "transforms_train.json").read_text())
    assert [f["file_path"] for f in train["frames"]] == ["./train/r_0", "./train/r_1"]
    assert train["camera_angle_x"] == 0.7 and train["frames"][1]["transform_matrix"] == [[1.0]]
    assert sorted(p.name for p in (tmp_path / "out" / "train").iterdir()) == ["r_0.png", "r_1.png", "r_3.png"]
    assert (tmp_path / "out" / "train" / "r_1.png").read_bytes() == bytes([1]) * 10
    assert not (tmp_path / "out" / "transforms_test.json").exists()  # no test split in the source


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _capture(tmp_path / "src")
    (tmp_path / "taken").mkdir()
    assert main([str(source), str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'taken'}: exists; expected a new folder\n"
    (source / "train" / "r_0.png").unlink()
    assert main([str(source), str(tmp_path / "new")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {source / './train/r_0'}: the image a frame names")
