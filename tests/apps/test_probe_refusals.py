"""Inputs that used to end in a traceback (issue 66's fault probe), each one line and exit status 2:
a frame or a mesh grid larger than the memory there is, checked before it is allocated; a damaged
checkpoint; mesh bounds that miss the scene; a run folder name longer than the file system allows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from runs import fork_app

from nerf_lightning.errors import EXIT_USER_ERROR, UserError

pytestmark = pytest.mark.slow


def _refused(tmp_path: Path, app: str, *argv: str) -> str:
    """The one line of ``python -m nerf_lightning.<app> argv...`` (forked), after checking its status 2."""
    name = f"{app}-{len(list(tmp_path.glob('*.err')))}"
    log, err = tmp_path / f"{name}.log", tmp_path / f"{name}.err"
    proc = fork_app(app, *argv, cwd=tmp_path, log=log, err_log=err)
    proc.join(timeout=120)
    stderr = err.read_text()
    assert proc.exitcode == EXIT_USER_ERROR, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_a_frame_larger_than_memory_is_refused_before_it_is_allocated(trained_run, tmp_path: Path) -> None:
    """A 100000 x 100000 frame: 1e10 pixels at 194 bytes each (rays 12, rendered colour/opacity/depth 20,
    the 8-bit colour's steps 39, depth 4; read back 11; depth.mp4's Turbo colours 108) = 1.94 TB."""
    run = trained_run[0]
    line = _refused(tmp_path, "render", f"ckpt={run}", "width=100000", "height=100000",
                    f"hydra.run.dir={tmp_path / 'orbit'}")  # fmt: skip
    assert line.startswith(
        "error: render width=100000 height=100000: a 100000x100000 frame needs 1.94 TB of memory, and the "
        "CPU has "
    ), line
    assert line.endswith("available; render a smaller frame")
    assert not (tmp_path / "orbit" / "rgb.mp4").exists()
    # the same size from a camera path file; without depth.mp4: 86 bytes per pixel
    path = tmp_path / "huge.json"
    keyframe = {"camera_to_world": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 4, 0, 0, 0, 1], "fov": 50}
    path.write_text(json.dumps({"camera_type": "perspective", "render_width": 100000,
                                "render_height": 100000, "fps": 24, "camera_path": [keyframe]}))  # fmt: skip
    line = _refused(tmp_path, "render", f"ckpt={run}", f"camera_path={path}", "depth=false",
                    f"hydra.run.dir={tmp_path / 'file'}")  # fmt: skip
    assert line.startswith(
        f"error: render camera_path={path} (render_width=100000, render_height=100000): a 100000x100000 "
        "frame needs 860 GB of memory, and the CPU has "
    ), line


def test_a_mesh_grid_larger_than_memory_is_refused_and_leaves_no_folder(trained_run, tmp_path: Path) -> None:
    """resolution=100000 over the unit cube: 100001^3 corners at 60 bytes (the density at float32 and
    float64, its gradient and the stacked gradient) = 60 PB; the ``out`` folder it made is gone."""
    out = tmp_path / "new" / "meshes"
    line = _refused(tmp_path, "export", "mesh", f"ckpt={trained_run[0]}", "resolution=100000",
                    "bounds=[0,0,0,1,1,1]", f"out={out}", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert line.startswith(
        "error: export mesh resolution=100000: a grid of 100001x100001x100001 corners needs 60 PB of memory, "
        "and the CPU has "
    ), line
    assert line.endswith("available; lower resolution")
    assert not (tmp_path / "new").exists()


def test_mesh_bounds_that_miss_the_scene_name_its_box(trained_run, tmp_path: Path) -> None:
    """Bounds outside the occupied cells hold no surface at any threshold: the line says so, with the box."""
    line = _refused(tmp_path, "export", "mesh", f"ckpt={trained_run[0]}", "bounds=[5,5,5,6,6,6]",
                    f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert "the box holds no occupied cell of the scene: the scene's occupied cells lie in [" in line, line
    assert "give bounds that overlap that box, or bounds=null" in line
    assert "threshold" not in line.split("):", 1)[1]  # no advice to lower it
    assert not (tmp_path / "out").exists()


def _damaged(run: Path, tmp_path: Path, name: str, damage) -> Path:  # noqa: ANN001
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    damage(checkpoint)
    path = tmp_path / name
    torch.save(checkpoint, path)
    return path


def test_damaged_checkpoints_name_the_file_and_what_was_expected(trained_run, tmp_path: Path) -> None:
    run = trained_run[0]
    five = _damaged(run, tmp_path, "model5.ckpt", lambda c: c["nerf_lightning"]["config"].update(model=5))
    line = _refused(tmp_path, "eval", f"ckpt={five}", f"hydra.run.dir={tmp_path / 'a'}")
    assert line == (
        f"error: {five}: the stored run config's `model` section is 5 (an int); expected a mapping of the "
        "run's model.* keys (the checkpoint is damaged: use another one of the run)"
    )
    gone = _damaged(run, tmp_path, "gone.ckpt", lambda c: c["nerf_lightning"].update(config=[1, 2]))
    line = _refused(tmp_path, "render", f"ckpt={gone}", f"hydra.run.dir={tmp_path / 'b'}")
    assert line.startswith(f"error: {gone}: its stored run config (checkpoint['nerf_lightning']['config']) "
                           "is [1, 2] (a list); expected a mapping")  # fmt: skip
    # a tensor missing, and no model override on the command line: nothing to drop
    missing = _damaged(run, tmp_path, "missing.ckpt", lambda c: c["state_dict"].pop("field.encoding.params"))
    line = _refused(tmp_path, "export", "mesh", f"ckpt={missing}", f"out={tmp_path / 'm'}",
                    f"hydra.run.dir={tmp_path / 'c'}")  # fmt: skip
    assert line == (
        f"error: {missing}: its weights do not fit the model built from its own stored config (Missing "
        'key(s) in state_dict: "field.encoding.params".); the checkpoint is damaged or incomplete: use '
        "another one of the run"
    )


def test_a_run_folder_name_longer_than_the_file_system_allows(tmp_path: Path) -> None:
    run = tmp_path / ("a" * 300)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    line = _refused(tmp_path, "train", "experiment=cpu", f"hydra.run.dir={run}")
    assert line == (
        f"error: hydra.run.dir={run}: the folder name '{'a' * 20}...{'a' * 12}' is 300 bytes long, and "
        f"the file system allows {limit} (NAME_MAX); choose a shorter hydra.run.dir"
    )
    sweep = tmp_path / ("b" * 300)
    line = _refused(tmp_path, "train", "-m", "experiment=cpu", "seed=1,2", f"hydra.sweep.dir={sweep}")
    assert line.startswith(f"error: hydra.sweep.dir={sweep}: the folder name '{'b' * 20}...")


def test_an_allocation_fits_or_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nerf_lightning.utils.memory import _meminfo_available, check_fits, show_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n")
    assert _meminfo_available(meminfo) == 8_192_000_000
    assert _meminfo_available(tmp_path / "none") is None
    assert [show_bytes(n) for n in (512, 40e9, 1.94e12, 2.5e15)] == ["512 B", "40 GB", "1.94 TB", "2.5 PB"]
    monkeypatch.setattr("nerf_lightning.utils.memory.available_bytes", lambda device: 8_000_000_000)
    cpu = torch.device("cpu")
    check_fits("export mesh resolution=8", cpu, 4_000_000_000, 4_000_000_000, "lower resolution")
    with pytest.raises(UserError) as err:  # on the CPU the device's and the host's bytes add up
        check_fits("export mesh resolution=9", cpu, 4_000_000_000, 4_000_000_001, "lower resolution")
    assert str(err.value) == (
        "export mesh resolution=9 needs 8 GB of memory, and the CPU has 8 GB available; lower resolution"
    )
