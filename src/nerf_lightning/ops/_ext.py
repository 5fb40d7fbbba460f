"""Builder/loader of the nerf_lightning CUDA extension (``ops/csrc``), compiled on first use.

The extension is built with ``torch.utils.cpp_extension.load`` (ninja) the first time a CUDA op is
wanted and cached in ``$TORCH_EXTENSIONS_DIR`` (if set) or ``~/.cache/nerf_lightning/torch_extensions``,
in a folder per torch/CUDA version; a later process only checks and imports it (seconds). While it
builds (first use, or sources/flags/architectures changed: a stamp file in the cache records the
last build), ONE line is printed to stderr. Nothing here runs at import or install time.

Any failure (no GPU, CPU-only torch, no ``nvcc``/ninja, a compiler error) makes :func:`load` return
None, with ONE ``RuntimeWarning`` naming the reason; callers then use the PyTorch reference ops.

Architectures: ``TORCH_CUDA_ARCH_LIST`` when set, else the compute capabilities of the visible
GPUs (``9.0`` -> sm_90 on the H200).

Ahead-of-time build (packagers, containers, cluster login nodes with a GPU)::

    TORCH_EXTENSIONS_DIR=/path/to/cache python -m nerf_lightning.ops._ext          # build + self-check
    TORCH_CUDA_ARCH_LIST="8.0;9.0" python -m nerf_lightning.ops._ext --no-check   # no GPU needed

and ship/point ``TORCH_EXTENSIONS_DIR`` at that cache. ``NERF_LIGHTNING_NO_CUDA_EXT=1`` disables the
extension entirely (reference ops, no warning).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

EXT_NAME = "nerf_lightning_cuda"
CSRC = Path(__file__).resolve().parent / "csrc"
# one kernel file per concept, named after the ops/cuda module it serves (step_ops.cu: the kernels
# the fused training step shares across modules)
SOURCES = (
    "bindings.cpp",
    "encoding.cu",
    "rays.cu",
    "grid.cu",
    "marching.cu",
    "compositing.cu",
    "losses.cu",
    "step_ops.cu",
    "mlp.cu",
)
# --fmad=false: a*b+c rounded twice, like PyTorch's elementwise kernels, so that the kernels equal
# the reference bit for bit where the contract asks for it (marching t values).
CUDA_FLAGS = ("-O3", "--fmad=false", "-lineinfo")
CXX_FLAGS = ("-O3",)

_lock = threading.Lock()
_state: dict[str, object] = {"tried": False, "module": None, "error": None}


def cache_dir() -> Path:
    """Build folder of the extension for this torch / CUDA version."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        Path.home() / ".cache" / "nerf_lightning" / "torch_extensions"
    )
    tag = f"torch{torch.__version__.split('+')[0]}_cu{(torch.version.cuda or 'none').replace('.', '')}"
    return Path(root) / f"{EXT_NAME}_{tag}"


def _arch_list() -> str | None:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return None  # the user's choice; cpp_extension reads it
    if not torch.cuda.is_available():
        return None
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{a}.{b}" for a, b in caps)


def _why_unavailable(require_gpu: bool) -> str | None:
    if os.environ.get("NERF_LIGHTNING_NO_CUDA_EXT", "") not in ("", "0"):
        return "disabled by NERF_LIGHTNING_NO_CUDA_EXT"
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if require_gpu and not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None or not (Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc").exists():
        if shutil.which("nvcc") is None:
            return "the CUDA toolkit (nvcc) was not found; set CUDA_HOME"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def _stamp(arch: str) -> str:
    """Identity of a build: sources, flags, architectures and torch version (decides the log line)."""
    h = hashlib.sha256()
    for name in sorted(p.name for p in CSRC.iterdir() if p.is_file()):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(repr((CUDA_FLAGS, CXX_FLAGS, arch, torch.__version__, torch.version.cuda)).encode())
    return h.hexdigest()


def build(verbose: bool = False, require_gpu: bool = True) -> ModuleType:
    """Compile (or load the cached build of) the extension; raises on failure."""
    reason = _why_unavailable(require_gpu)
    if reason is not None:
        raise RuntimeError(reason)
    from torch.utils import cpp_extension

    bdir = cache_dir()
    bdir.mkdir(parents=True, exist_ok=True)
    arch = _arch_list()
    stamp = _stamp(arch or os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    stamp_file = bdir / "nerf_lightning.stamp"
    so = next(iter(sorted(bdir.glob(f"{EXT_NAME}*.so"))), None)
    cached = so is not None and stamp_file.exists() and stamp_file.read_text() == stamp
    if cached:
        module = _load_cached(so)
        if module is not None:
            return module
    old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    start = time.perf_counter()
    if not cached:
        print(
            "[nerf_lightning] building the CUDA extension for arch "
            f"{os.environ.get('TORCH_CUDA_ARCH_LIST', '?')} "
            f"in {bdir} (first use or changed sources: about 1-2 minutes; cached afterwards)...",
            file=sys.stderr,
            flush=True,
        )
    try:
        module = cpp_extension.load(
            name=EXT_NAME,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS),
            extra_include_paths=[str(CSRC)],
            build_directory=str(bdir),
            verbose=verbose,
        )
    finally:
        if arch:
            if old_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
    try:
        stamp_file.write_text(stamp)
    except OSError:  # a read-only shared cache still loads; only the log line is affected
        pass
    if not cached:
        print(
            f"[nerf_lightning] CUDA extension built in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return module


def _load_cached(so: Path) -> ModuleType | None:
    """Import the cached build ``so`` directly (its stamp matches).

    ``cpp_extension.load`` would run ninja, which rebuilds whenever the sources' absolute paths or
    mtimes differ from the cache's (a cache copied to another checkout or machine, as the Docker image
    and the device runs do), although the stamp already proves the build is the same."""
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location(EXT_NAME, so)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError:  # e.g. built against another libtorch: rebuild through cpp_extension
        return None
    return module


def load() -> ModuleType | None:
    """The compiled extension, or None (one RuntimeWarning with the reason) when it cannot be had."""
    with _lock:
        if _state["tried"]:
            return _state["module"]  # type: ignore[return-value]
        _state["tried"] = True
        try:
            _state["module"] = build()
        except Exception as exc:  # any failure means "use the reference", never a crash
            _state["error"] = f"{type(exc).__name__}: {exc}".strip()
            quiet = os.environ.get("NERF_LIGHTNING_NO_CUDA_EXT", "") not in ("", "0")
            if not quiet:
                warnings.warn(
                    f"nerf_lightning CUDA extension unavailable ({_state['error'][:2000]}); "
                    "using the PyTorch reference ops (slower).",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return _state["module"]  # type: ignore[return-value]


def error() -> str | None:
    """Why :func:`load` returned None (None if it succeeded or was not tried)."""
    return _state["error"]  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """``python -m nerf_lightning.ops._ext [--no-check] [--verbose]``: ahead-of-time build."""
    argv = sys.argv[1:] if argv is None else argv
    check = "--no-check" not in argv
    try:
        build(verbose="--verbose" in argv, require_gpu=check)
    except Exception as exc:
        print(f"[nerf_lightning] build failed: {exc}", file=sys.stderr)
        return 1
    print(f"[nerf_lightning] CUDA extension ready in {cache_dir()}")
    if check:
        print("[nerf_lightning] is_available():", torch.cuda.is_available() and load() is not None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
