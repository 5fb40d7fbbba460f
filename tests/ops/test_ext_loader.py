"""The extension loader never fails: no CUDA -> None with ONE warning; the build log line logic (CPU)."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from nerf_lightning.ops import _ext


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(_ext, "_state", {"tried": False, "module": None, "error": None})


def test_unavailable_means_none_and_one_warning(fresh_state, monkeypatch):
    monkeypatch.setattr(_ext, "_why_unavailable", lambda require_gpu: "no CUDA GPU is visible")
    monkeypatch.delenv("NERF_LIGHTNING_NO_CUDA_EXT", raising=False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert _ext.load() is None
        assert _ext.load() is None  # cached: no second warning
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "no CUDA GPU is visible" in msgs[0] and "reference" in msgs[0]
    assert _ext.error() is not None


def test_build_error_is_caught(fresh_state, monkeypatch):
    def boom(**kwargs):
        raise RuntimeError("nvcc exploded")

    monkeypatch.setattr(_ext, "_why_unavailable", lambda require_gpu: None)
    monkeypatch.setattr("torch.utils.cpp_extension.load", boom)
    with pytest.warns(RuntimeWarning, match="nvcc exploded"):
        assert _ext.load() is None


def test_disabled_by_env_is_quiet(fresh_state, monkeypatch):
    monkeypatch.setenv("NERF_LIGHTNING_NO_CUDA_EXT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ext.load() is None


def test_build_line_only_when_sources_change(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_ext, "_why_unavailable", lambda require_gpu: None)
    calls = []

    def fake_load(name, build_directory, **kwargs):
        calls.append(name)
        (tmp_path / build_directory / f"{name}.so").write_text("x")
        return types.SimpleNamespace(name=name)

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    assert _ext.build().name == _ext.EXT_NAME
    assert "building the CUDA extension" in capsys.readouterr().err
    _ext.build()  # same sources and flags: loads quietly
    assert "building" not in capsys.readouterr().err
    monkeypatch.setattr(_ext, "CUDA_FLAGS", (*_ext.CUDA_FLAGS, "-DCHANGED"))
    _ext.build()
    assert "building the CUDA extension" in capsys.readouterr().err
    assert len(calls) == 3 and _ext.cache_dir().parent == tmp_path


def test_cuda_module_imports_and_falls_back_on_cpu(monkeypatch: pytest.MonkeyPatch):
    from nerf_lightning.ops import cuda as cu
    from nerf_lightning.ops import reference as ref
    from nerf_lightning.ops.cuda import _support

    monkeypatch.setattr(_support, "_warned", set())  # the warning is once per process

    o = torch.rand(5, 3)
    d = torch.nn.functional.normalize(torch.randn(5, 3), dim=-1)
    box = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    with pytest.warns(RuntimeWarning, match="ray_aabb_intersect: its input is not on a CUDA device"):
        got = cu.ray_aabb_intersect(o, d, box)  # CPU tensors: the reference, no build attempted
    want = ref.ray_aabb_intersect(o, d, box)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_every_kernel_file_is_compiled_and_named_after_an_op_module():
    """A .cu/.cpp in csrc/ that SOURCES forgets would leave its ops undefined at import of the build;
    each kernel file carries the name of the ops/cuda module it serves (step_ops.cu: step.py and the fused
    step's kernels of other modules; bindings.cpp: the Python module)."""
    on_disk = sorted(p.name for p in _ext.CSRC.iterdir() if p.suffix in (".cu", ".cpp"))
    assert sorted(_ext.SOURCES) == on_disk
    assert len(set(_ext.SOURCES)) == len(_ext.SOURCES)
    modules = {p.stem for p in (_ext.CSRC.parent / "cuda").glob("*.py")}
    for name in on_disk:
        if name != "bindings.cpp":
            assert name.removesuffix(".cu").removesuffix("_ops") in modules, name
