"""atomic_directory: a folder appears whole or not at all, and replaces a full one only when told to."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nerf_lightning.utils.io import atomic_directory


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def test_the_folder_appears_only_when_the_body_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            (tmp / "half.txt").write_text("half")
            assert tmp.parent == out.parent and tmp.name.startswith(".capture.tmp-")
            raise RuntimeError("interrupted")
    assert not out.exists() and _siblings(out) == []

    with atomic_directory(out) as tmp:
        (tmp / "done.txt").write_text("done")
        assert not out.exists()  # nothing at `out` until the end
    assert (out / "done.txt").read_text() == "done" and _siblings(out) == []
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_full_folder_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(FileExistsError):
        with atomic_directory(out) as tmp:
            (tmp / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["old.txt"] and _siblings(out) == []

    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"] and _siblings(out) == []

    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_directory(empty) as tmp:
        (tmp / "x").write_text("x")
    assert [p.name for p in empty.iterdir()] == ["x"]
