"""The ops registry on a CPU-only machine: the op list derived from the reference, every backend complete,
``auto``'s routing and its log line, and the CUDA wrappers' rule for input their kernels do not take
(one warning that names the op, never a silent fallback). Stand-in CUDA modules and tensors that report
``is_cuda`` play the GPU; the GPU suite checks the same with the real extension
(``tests/ops/test_cuda_ops.py::test_no_op_falls_back_to_the_reference``)."""

from __future__ import annotations

import ast
import inspect
import logging
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nerf_lightning.ops import OP_NAMES, get_ops, hash_encoding_backend, registry
from nerf_lightning.ops import cuda as cu
from nerf_lightning.ops import reference as ref
from nerf_lightning.ops.cuda import _support

UNIT_BOX = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on a CUDA device (what the dispatcher looks at)."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from a registry that has probed, resolved, logged and warned nothing."""
    monkeypatch.setattr(registry, "_cuda_state", {"probed": False, "module": None, "warned": False})
    for name in ("_announced", "_warned"):
        monkeypatch.setattr(registry, name, set())
    for name in ("_resolved", "_auto_hash"):
        monkeypatch.setattr(registry, name, {})
    monkeypatch.setattr(_support, "_warned", set())


def _fake_cuda_module(calls: list[str], missing: tuple[str, ...] = ()) -> SimpleNamespace:
    def make(name: str):
        def fn(*args, **kwargs):
            calls.append(name)
            return f"cuda:{name}"

        return fn

    ops = {n: make(n) for n in OP_NAMES if n not in missing}
    return SimpleNamespace(__name__="fake_cuda", data=SimpleNamespace(__all__=["sample_pixels"]), **ops)


# ----------------------------------------------------------------------------- the op list
def test_op_names_are_the_public_functions_of_the_reference_concept_modules() -> None:
    """Written out once: the ops are what the concept modules export, nothing else, no name twice."""
    from_modules = [n for m in ref.MODULES for n in m.__all__ if inspect.isfunction(getattr(m, n))]
    assert list(OP_NAMES) == from_modules and len(set(OP_NAMES)) == len(OP_NAMES)
    assert {"march_rays", "volume_render", "hash_encode", "sh_encode", "fused_mlp"} <= set(OP_NAMES)
    assert "PackedSamples" not in OP_NAMES and "SQRT3" not in OP_NAMES
    for name in OP_NAMES:  # the contract is written down
        doc = getattr(ref, name).__doc__ or ""
        assert "Args:" in doc and "Returns:" in doc, name


def test_the_cuda_backend_has_every_op_once_a_kernel_or_the_reference_itself() -> None:
    kernels = {n for m in cu.MODULES for n in m.__all__}
    reused = set(cu.REFERENCE_OPS)
    assert not kernels & reused
    assert set(OP_NAMES) <= kernels | reused
    assert kernels - set(OP_NAMES) == set(cu.data.__all__) == {"training_rays", "sample_pixels"}
    for name in reused:
        assert getattr(cu, name) is getattr(ref, name), name
    for name in set(OP_NAMES) - reused:
        fn = getattr(cu, name)
        assert fn is not getattr(ref, name) and f"nerf_lightning.ops.reference.{name}" in fn.__doc__, name


def test_no_cuda_wrapper_calls_the_reference_except_through_the_warning() -> None:
    """Source check of ``ops/cuda/*.py``: the reference ops are reached only through
    ``_support.reference_for`` (which warns); no module imports or calls one directly."""
    root = Path(cu.__file__).parent
    for path in sorted(root.glob("*.py")):
        if path.name in ("__init__.py", "_support.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "reference" in node.module:
                imported = {a.name for a in node.names}
                assert not imported & set(OP_NAMES), f"{path.name} imports reference ops {imported}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert node.value.id not in ("reference", "ref", "_ref"), f"{path.name}: {node.value.id}."


# ----------------------------------------------------------------------------- get_ops
def test_auto_sends_cuda_tensors_to_the_cuda_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(registry, "cuda_ops", lambda: _fake_cuda_module(calls))
    auto = get_ops("auto")
    on_cuda = torch.zeros(4, 3).as_subclass(_OnCuda)
    for name in OP_NAMES:
        # the first tensor argument decides, positional or keyword
        assert getattr(auto, name)(on_cuda, 1) == f"cuda:{name}"
        assert getattr(auto, name)(scale=2, x=on_cuda) == f"cuda:{name}"
    assert calls == [n for n in OP_NAMES for _ in range(2)]
    # CPU tensors run the reference (here: a real call with its real result)
    calls.clear()
    o = torch.tensor([[0.5, 0.5, -1.0]])
    d = torch.tensor([[0.0, 0.0, 1.0]])
    t_near, t_far, hit = auto.ray_aabb_intersect(o, d, UNIT_BOX)
    assert calls == [] and bool(hit[0]) and (float(t_near[0]), float(t_far[0])) == (1.0, 2.0)


def test_auto_without_an_extension_runs_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "cuda_ops", lambda: None)
    on_cuda = torch.tensor([[0.5, 0.5, -1.0]]).as_subclass(_OnCuda)
    d = torch.tensor([[0.0, 0.0, 1.0]])
    t_near, _, hit = get_ops("auto").ray_aabb_intersect(on_cuda, d, UNIT_BOX)
    assert bool(hit[0]) and float(t_near[0]) == 1.0


def test_cuda_backend_is_the_complete_cuda_module_and_an_incomplete_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    fake = _fake_cuda_module(calls)
    monkeypatch.setattr(registry, "cuda_ops", lambda: fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the extension is there: no fallback warning
        assert get_ops("cuda") is fake
    assert get_ops("cuda").march_rays(torch.zeros(1, 3)) == "cuda:march_rays" and calls == ["march_rays"]
    monkeypatch.setattr(registry, "_resolved", {})
    monkeypatch.setattr(registry, "cuda_ops", lambda: _fake_cuda_module(calls, missing=("cascade_of",)))
    with pytest.raises(RuntimeError, match=r"ops backend 'fake_cuda' lacks the ops \['cascade_of'\]"):
        get_ops("cuda")
    assert get_ops("torch") is ref and get_ops("reference") is ref
    with pytest.raises(ValueError, match="unknown ops backend 'tcnn'"):
        get_ops("tcnn")


def test_cuda_backend_without_extension_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "cuda_ops", lambda: None)
    with pytest.warns(RuntimeWarning, match="using the PyTorch reference"):
        assert get_ops("cuda") is ref
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_ops("cuda") is ref  # one warning per process, not one per call


def test_each_backend_logs_what_it_resolved_to_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer

    caplog.set_level(logging.INFO, logger="nerf_lightning.ops")
    if not torch.cuda.is_available():
        Renderer(OccupancyGrid(resolution=8, ops="auto"), backend="auto")  # the setup call site
        Renderer(OccupancyGrid(resolution=8, ops="auto"), backend="auto")
        lines = [r.getMessage() for r in caplog.records]
        want = "ops backend auto: the PyTorch reference ops (no CUDA kernels: no CUDA GPU is visible)"
        assert lines == [want]
    caplog.clear()
    monkeypatch.setattr(registry, "_resolved", {})
    monkeypatch.setattr(registry, "_announced", set())
    monkeypatch.setattr(registry, "cuda_ops", lambda: _fake_cuda_module([]))
    monkeypatch.setattr(registry, "_gpu_name", lambda: "NVIDIA H200")
    get_ops("auto")
    get_ops("torch")
    get_ops("auto")
    assert [r.getMessage() for r in caplog.records] == [
        "ops backend auto: our CUDA kernels for CUDA tensors (NVIDIA H200), the PyTorch reference for CPU "
        "tensors",
        "ops backend torch: the PyTorch reference ops",
    ]


# ----------------------------------------------------------------------------- CUDA wrappers' input rule
def _rays(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    o = torch.rand(n, 3, generator=g) * 2 - 0.5
    return o, torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)


def test_a_wrapper_given_cpu_tensors_warns_once_naming_itself_and_runs_the_reference() -> None:
    o, d = _rays()
    with pytest.warns(RuntimeWarning) as record:
        got = cu.ray_aabb_intersect(o, d, UNIT_BOX)
        again = cu.ray_aabb_intersect(o, d, UNIT_BOX)  # same op, same reason: no second warning
    assert [str(w.message) for w in record] == [
        "nerf_lightning.ops.cuda.ray_aabb_intersect: its input is not on a CUDA device; running the "
        "PyTorch reference instead (slower). This warning is shown once."
    ]
    for a, b, c in zip(got, again, ref.ray_aabb_intersect(o, d, UNIT_BOX), strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)
    # another op warns for itself
    grid = torch.rand(2, 8**3)
    with pytest.warns(RuntimeWarning, match=r"^nerf_lightning\.ops\.cuda\.grid_ema_update: its input"):
        new = cu.grid_ema_update(grid, torch.tensor([0, 5]), torch.tensor([3.0, 4.0]), 0.5)
    assert torch.equal(new, ref.grid_ema_update(grid, torch.tensor([0, 5]), torch.tensor([3.0, 4.0]), 0.5))


def test_a_wrapper_given_an_unsupported_dtype_warns_once_with_the_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the kernels "available", float64 rays are still not theirs: one warning, the reference."""
    monkeypatch.setattr(_support, "is_available", lambda: True)
    o, d = (t.double().as_subclass(_OnCuda) for t in _rays())
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(3):
            got = cu.ray_aabb_intersect(o, d, UNIT_BOX)
    assert [str(w.message) for w in record] == [
        "nerf_lightning.ops.cuda.ray_aabb_intersect: the kernels take float32 input, got float64; running "
        "the PyTorch reference instead (slower). This warning is shown once."
    ]
    want = ref.ray_aabb_intersect(o.as_subclass(torch.Tensor), d.as_subclass(torch.Tensor), UNIT_BOX)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    x = torch.rand(10, 3).as_subclass(_OnCuda)
    table = torch.rand(16, 3).as_subclass(_OnCuda)  # F = 3: not a kernel width
    with pytest.warns(RuntimeWarning, match=r"hash_encode: the kernels take tables \[rows, F\]"):
        cu.hash_encode(x, table, [1.0], [2], [0, 16])


def test_shapes_the_contract_rules_out_raise_before_any_fallback() -> None:
    o, d = _rays()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"aabb must have shape \[6\]"):
            cu.ray_aabb_intersect(o, d, torch.zeros(5))
        with pytest.raises(ValueError, match="not a multiple of 8"):
            cu.pack_bitfield(torch.zeros(1, 3, 3, 3, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"pred and target must be \[R, 3\]"):
            cu.masked_ray_loss(torch.zeros(4, 2), torch.zeros(4, 2), torch.ones(4, dtype=torch.bool))


def test_data_kernels_have_no_fallback_and_are_reached_through_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    u = torch.rand(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="sample_pixels: its input is not on a CUDA device"):
        cu.sample_pixels(u, torch.ones(4, dtype=torch.float64), torch.ones(1), torch.ones(1), 2)
    from nerf_lightning.ops import data_kernel

    assert data_kernel("sample_pixels", u) is None  # CPU tensors: the caller's torch path
    fake = _fake_cuda_module([])
    fake.sample_pixels = lambda *a: "kernel"
    monkeypatch.setattr(registry, "cuda_ops", lambda: fake)
    assert data_kernel("sample_pixels", u.as_subclass(_OnCuda))() == "kernel"
    with pytest.raises(ValueError, match="no data kernel 'march_rays'"):
        data_kernel("march_rays", u.as_subclass(_OnCuda))


# ----------------------------------------------------------------------------- the hash encoding's choice
def _fake_tcnn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tinycudann", types.ModuleType("tinycudann"))


def test_auto_hash_encoding_never_picks_an_untested_tcnn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nerf_lightning.ops")
    x_cpu = torch.rand(4, 3)
    assert hash_encoding_backend("auto", x_cpu) == "torch"
    _fake_tcnn(monkeypatch)  # tinycudann imports ...
    monkeypatch.setattr(registry, "cuda_ops", lambda: _fake_cuda_module([]))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    x = torch.rand(4, 3).as_subclass(_OnCuda)
    monkeypatch.setattr(registry, "_auto_hash", {})  # decided once per device: x "is" on another one
    assert hash_encoding_backend("auto", x) == "cuda"  # ... but is not listed as tested and faster here
    assert hash_encoding_backend("auto", x) == "cuda"
    assert hash_encoding_backend("tcnn", x) == "tcnn"  # asked for by name: it is used
    monkeypatch.setattr(registry, "_auto_hash", {})
    monkeypatch.setitem(registry.TCNN_FASTER_ON, "NVIDIA H200", "1.3x the steps/s (BENCHMARKS.md)")
    assert hash_encoding_backend("auto", x) == "tcnn"
    monkeypatch.setitem(sys.modules, "tinycudann", None)  # listed, but not importable: our kernels
    monkeypatch.setattr(registry, "_auto_hash", {})
    assert hash_encoding_backend("auto", x) == "cuda"
    assert [r.getMessage() for r in caplog.records] == [
        "hash encoding backend auto -> torch (CPU input)",
        "hash encoding backend auto -> cuda (our kernels on NVIDIA H200)",
        "hash encoding backend auto -> tcnn (tested and faster than our kernels on NVIDIA H200: 1.3x the "
        "steps/s (BENCHMARKS.md))",
    ]


def test_explicit_hash_backends_that_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU input: the torch encoding (the same table) with one warning per backend; tcnn asked for on a
    GPU without tinycudann: an error that says why, never a silent slow path."""
    monkeypatch.setitem(sys.modules, "tinycudann", None)
    x = torch.rand(4, 3)
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(2):
            assert hash_encoding_backend("tcnn", x) == "torch"
            assert hash_encoding_backend("cuda", x) == "torch"
    messages = [str(w.message) for w in record]
    assert len(messages) == 2 and "backend=tcnn" in messages[0] and "backend=cuda" in messages[1]
    with pytest.raises(RuntimeError, match=r"backend=tcnn: tinycudann does not import \(ModuleNotFoundError"):
        hash_encoding_backend("tcnn", x.as_subclass(_OnCuda))
    assert hash_encoding_backend("torch", x) == "torch"
    with pytest.raises(ValueError, match="hash encoding backend must be one of"):
        hash_encoding_backend("fast", x)
