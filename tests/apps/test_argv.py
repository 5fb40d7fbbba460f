"""The apps' command lines: the shared normalization, the train app's own rewrite, and ``hydra_app``."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from nerf_lightning.apps.entry import hydra_app, normalize_argv
from nerf_lightning.apps.train import with_device_preset
from nerf_lightning.errors import EXIT_USER_ERROR, UserError


def test_numeric_precision_override_is_accepted() -> None:
    """`precision=32` on the command line selects the group option "32" (Hydra alone parses it as an int)."""
    assert normalize_argv(["precision=32", "devices=2", "precision=bf16-mixed", "+precision=16"]) == [
        "precision='32'",
        "devices=2",
        "precision=bf16-mixed",
        "+precision='16'",
    ]


def test_encoding_alias() -> None:
    assert normalize_argv(
        ["model.encoding.log2_hashmap_size=15,17,19", "+model.encoding.x=1", "~model.encoding.y",
         "model.net.field.encoding.n_levels=8", "data.path=/data/model.encoding.z", "precision=32"]
    ) == ["model.net.field.encoding.log2_hashmap_size=15,17,19", "+model.net.field.encoding.x=1",
          "~model.net.field.encoding.y", "model.net.field.encoding.n_levels=8",
          "data.path=/data/model.encoding.z",
          "precision='32'"]  # fmt: skip


def test_checkpoint_app_argv() -> None:
    """eval/render/export: a leading word is the positional key; ``data.``/``model.`` keys may be new."""
    argv = ["mesh", "ckpt=run", "data.path=/x", "model.val_chunk=8", "+data.k=1", "precision=32",
            "model.encoding.n_levels=4"]  # fmt: skip
    assert normalize_argv(argv, positional="what", open_nodes=("data", "model")) == [
        "what=mesh",
        "ckpt=run",
        "++data.path=/x",
        "++model.val_chunk=8",
        "+data.k=1",
        "precision='32'",
        "++model.net.field.encoding.n_levels=4",
    ]
    assert normalize_argv(["ckpt=run"], positional="what") == ["ckpt=run"]
    assert normalize_argv(["-m", "mesh"], positional="what") == ["-m", "mesh"]  # only a leading word


def test_cpu_preset_is_added_only_without_gpu_and_without_an_explicit_choice() -> None:
    assert with_device_preset(["data.downscale=8"], has_cuda=False) == ["data.downscale=8", "experiment=cpu"]
    assert with_device_preset(["-m", "seed=1,2"], has_cuda=False) == ["-m", "seed=1,2", "experiment=cpu"]
    assert with_device_preset(["data.downscale=8"], has_cuda=True) == ["data.downscale=8"]
    assert with_device_preset(["experiment=fox"], has_cuda=False) == ["experiment=fox"]
    # no preset: the default, which Hydra would refuse to be set to null ("Config group override must be
    # a string or a list")
    assert with_device_preset(["experiment=null", "seed=1"], has_cuda=False) == ["seed=1"]


# ------------------------------------------------------------------------------------ hydra_app
def echo(cfg: DictConfig) -> None:
    """A task that writes what it was given; ``what=bad`` is bad input."""
    if cfg.what == "bad":
        raise UserError("what=bad: expected mesh or pointcloud")
    seen = {"what": cfg.what, "data": OmegaConf.to_container(cfg.data),
            "matmul": torch.get_float32_matmul_precision()}  # fmt: skip
    Path(cfg.paths.output_dir, "seen.json").write_text(json.dumps(seen))


main = hydra_app("export", echo, positional="what")


def _run_main(argv: list[str], cwd: str, err_log: str) -> None:
    err = os.open(err_log, os.O_WRONLY | os.O_CREAT)
    os.dup2(err, 2)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(cwd)
    sys.argv = ["echo", *argv]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the exit status says it
        code = 1
    sys.stderr.flush()
    os._exit(code)


def _app(tmp_path: Path, *argv: str) -> tuple[int, str]:
    args = (list(argv), str(tmp_path), str(tmp_path / "err"))
    proc = mp.get_context("fork").Process(target=_run_main, args=args)
    proc.start()
    proc.join(timeout=120)
    return proc.exitcode, (tmp_path / "err").read_text()


def test_hydra_app_runs_its_task_on_the_normalized_command_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, err = _app(tmp_path, "pointcloud", "ckpt=x", "data.downscale=2", f"hydra.run.dir={run}")
    assert code == 0, err[-3000:]
    seen = json.loads((run / "seen.json").read_text())
    assert seen == {"what": "pointcloud", "data": {"downscale": 2}, "matmul": "high"}
    # the job is named after the task's module, not after the helper's
    assert OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra.job.name == __name__.rsplit(".", 1)[-1]


def test_hydra_app_turns_bad_input_into_one_line_and_exit_2(tmp_path: Path) -> None:
    code, err = _app(tmp_path, "bad", "ckpt=x", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == EXIT_USER_ERROR
    assert err.strip().splitlines()[-1] == "error: what=bad: expected mesh or pointcloud"


@pytest.mark.parametrize("app", ["train", "eval", "render", "export", "view"])
def test_every_app_has_a_main_behind_its_shim(app: str) -> None:
    """``python -m nerf_lightning.<app>`` and the console scripts reach the same ``main``."""
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    shim = f"nerf_lightning.{app}"
    target = importlib.import_module(f"nerf_lightning.apps.{app}").main
    assert importlib.import_module(shim).main is target
    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[f"nerf-{app}"] == f"nerf_lightning.apps.{app}:main"
