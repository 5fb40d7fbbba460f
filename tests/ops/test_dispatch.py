"""``get_ops`` routing on a CPU-only machine: with a stand-in CUDA module and tensors that report
``is_cuda``, "auto" and "cuda" must call the CUDA module, never fall back to the reference silently.
(The GPU suite checks the same with the real extension: ``tests/ops/test_cuda_ops.py``.)"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import nerf_lightning.ops as ops_pkg
from nerf_lightning.ops import OP_NAMES, get_ops
from nerf_lightning.ops import reference as ref


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on a CUDA device (what the dispatcher looks at)."""

    @property
    def is_cuda(self) -> bool:
        return True


def _fake_cuda_module(calls: list[str], missing: tuple[str, ...] = ()) -> SimpleNamespace:
    def make(name: str):
        def fn(*args, **kwargs):
            calls.append(name)
            return f"cuda:{name}"

        return fn

    return SimpleNamespace(__name__="fake_cuda", **{n: make(n) for n in OP_NAMES if n not in missing})


def test_auto_sends_cuda_tensors_to_the_cuda_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(ops_pkg, "cuda_ops", lambda: _fake_cuda_module(calls))
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
    t_near, t_far, hit = auto.ray_aabb_intersect(o, d, torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    assert calls == [] and bool(hit[0]) and (float(t_near[0]), float(t_far[0])) == (1.0, 2.0)


def test_auto_without_an_extension_runs_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_pkg, "cuda_ops", lambda: None)
    on_cuda = torch.tensor([[0.5, 0.5, -1.0]]).as_subclass(_OnCuda)
    d = torch.tensor([[0.0, 0.0, 1.0]])
    t_near, _, hit = get_ops("auto").ray_aabb_intersect(on_cuda, d, torch.tensor([0.0] * 3 + [1.0] * 3))
    assert bool(hit[0]) and float(t_near[0]) == 1.0


def test_cuda_backend_is_the_cuda_module_with_reference_for_missing_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(ops_pkg, "cuda_ops", lambda: _fake_cuda_module(calls, missing=("cascade_of",)))
    cuda = get_ops("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the extension is there: no fallback warning
        assert cuda.march_rays(torch.zeros(1, 3)) == "cuda:march_rays"
        assert cuda.volume_render() == "cuda:volume_render"
    assert cuda.cascade_of is ref.cascade_of
    assert calls == ["march_rays", "volume_render"]
    assert get_ops("torch") is ref and get_ops("reference") is ref


def test_cuda_backend_without_extension_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_pkg, "cuda_ops", lambda: None)
    monkeypatch.setitem(ops_pkg._cuda_state, "warned", False)
    with pytest.warns(RuntimeWarning, match="using the PyTorch reference"):
        assert get_ops("cuda") is ref
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_ops("cuda") is ref  # one warning per process, not one per call
