"""The GPU machine's one set-up (``benchmarks/gpu_common.sh``): every ``*_gpu.sh`` sources it and none
installs wheels of its own; without wheels it puts the checkout first on the path and unpacks the carried
extension cache; ``suite_gpu.sh`` hands its arguments to the runner."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

from runs import child_env

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "benchmarks").glob("*_gpu.sh"))


def test_every_gpu_script_sources_the_one_set_up_and_installs_nothing_itself() -> None:
    names = {s.name for s in SCRIPTS}
    assert names >= {"official_gpu.sh", "mesh_gpu.sh", "big_captures_gpu.sh", "suite_gpu.sh"}
    for script in SCRIPTS:
        text = script.read_text()
        assert "source benchmarks/gpu_common.sh" in text, script.name
        assert "pip install" not in text and "PYTHONPATH=" not in text, script.name
    assert (REPO / "benchmarks" / "gpu_common.sh").read_text().count("pip install") == 1


def test_without_wheels_the_checkout_comes_first_and_the_extension_cache_is_unpacked(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / ".devdata").mkdir(parents=True)
    payload = b"a built extension"
    with tarfile.open(checkout / ".devdata" / "ext.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("nerf_ops/ops.so")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    common = REPO / "benchmarks" / "gpu_common.sh"
    script = f'source "{common}" && cd "{checkout}" && gpu_wheels >/dev/null'
    script += ' && echo "$PYTHONPATH $TORCH_EXTENSIONS_DIR"'
    env = child_env(PYTHONPATH="/elsewhere", WHEELS="", PYTHON=sys.executable)
    env.pop("TORCH_EXTENSIONS_DIR", None)
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path, extensions = out.stdout.split()
    assert path == f"{checkout}/src:{checkout}:/elsewhere"
    assert extensions == f"{checkout}/.torch_extensions"
    assert (checkout / ".torch_extensions" / "nerf_ops" / "ops.so").read_bytes() == payload


def test_the_suite_script_runs_the_runner_with_its_arguments() -> None:
    env = child_env(WHEELS="", PYTHON=sys.executable)
    command = ["bash", "benchmarks/suite_gpu.sh", "--list"]
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].split()[:2] == ["name", "jobs"]
    assert any(line.startswith("cpu-smoke ") for line in out.stdout.splitlines())
